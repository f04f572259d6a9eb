"""GX's Data Docs views share their compiled Jinja templates (``share_compiled_templates``)."""

from __future__ import annotations

import jinja2
from great_expectations.render.view.view import DefaultJinjaPageView, DefaultJinjaView

from tidewater.quality.validate import share_compiled_templates

TEMPLATE = "index_page.j2"  # one of GX's own, with includes


def test_a_second_view_compiles_no_template_the_first_one_compiled(monkeypatch):
    share_compiled_templates()
    share_compiled_templates()  # installed once per process: the cache is the same one
    compiled: list[str | None] = []
    compile_ = jinja2.Environment.compile

    def counting(env: jinja2.Environment, source, name=None, filename=None, raw=False, defer_init=False):
        compiled.append(name)
        return compile_(env, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    first, second = DefaultJinjaPageView(), DefaultJinjaView()
    assert first.env.bytecode_cache is not None and first.env.bytecode_cache is second.env.bytecode_cache

    first._get_template(TEMPLATE)
    before = len(compiled)
    second._get_template(TEMPLATE)
    assert len(compiled) == before  # loaded from the shared code, its checksum matching

    plain = jinja2.Environment(loader=first.env.loader)  # the control: an environment of its own compiles
    plain.get_template(TEMPLATE)
    assert compiled[before:] == [TEMPLATE]
