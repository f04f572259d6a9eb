"""``tidewater pipelines`` and ``tidewater tables``: what is declared, and what the lake holds for it."""

from __future__ import annotations

import argparse

from tidewater.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    tables = sub.add_parser("tables", help="list the lake's tables")
    tables.add_argument("--namespace", default=None)
    tables.set_defaults(func=cmd_tables)

    pipelines = sub.add_parser("pipelines", help="the pipelines this deployment runs, as declared graphs")
    pipelines.add_argument("name", nargs="?", help="one pipeline (default: all)")
    pipelines.add_argument(
        "--format", choices=("text", "mermaid"), default="text", help="text, or a Mermaid flowchart to paste in docs"
    )
    pipelines.set_defaults(func=cmd_pipelines)


def cmd_tables(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.lake.tables import LakeTable
    from tidewater.pipelines import all_pipelines
    from tidewater.pipelines.layout import PipelineLayout

    print(f"{'table':<60} {'version':>7} {'rows':>12} {'files':>6} {'MiB':>8}")
    for pipeline in all_pipelines(settings).values():
        layout = PipelineLayout.of(settings, pipeline, args.namespace)
        for name in layout.table_names:
            table = LakeTable(layout.table_uri(name))
            if not table.exists():
                continue
            files = table.files()
            rows = sum(f.num_records or 0 for f in files)
            size = sum(f.size for f in files) / 2**20
            print(f"{table.uri:<60} {table.version():>7} {rows:>12,} {len(files):>6} {size:>8.1f}")
    return 0


def cmd_pipelines(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.pipelines import all_pipelines, pipeline_option
    from tidewater.pipelines.graph import describe, mermaid

    chosen = [pipeline_option(args.name, "name")] if args.name else list(all_pipelines(settings).values())
    for pipeline in chosen:
        if args.format == "mermaid":
            print(mermaid(pipeline))
        else:
            print("\n".join(describe(pipeline, shared_queries=settings.gold_shared_queries)))
    return 0
