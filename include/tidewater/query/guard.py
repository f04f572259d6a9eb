"""The read-only guard: which SQL may run against the lake, and the SQL that actually runs.

The guard works on its own tokenisation of the statement (string literals, quoted identifiers and
comments are tokens, so a keyword inside them never counts and never hides), and the engine runs
the SQL *re-emitted from these tokens*: comments dropped, strings and quoted identifiers written
back in one canonical form. What DataFusion parses is therefore exactly what the guard judged;
a literal form the guard cannot re-emit faithfully (``E'\\''`` escapes, ``$1`` placeholders) is
refused rather than passed through.

Rules:

- exactly one statement (trailing ``;`` allowed);
- it is a query: ``SELECT``, ``WITH ... SELECT``, ``VALUES``, a parenthesised query, or
  ``EXPLAIN [ANALYZE] [VERBOSE]`` of one; a writing or session keyword anywhere (INSERT, UPDATE,
  DELETE, MERGE, CREATE, DROP, ALTER, COPY, TRUNCATE, SET, INTO, ...) refuses it;
- every table reference (after FROM, JOIN, a comma of a FROM list) is a catalog name or a CTE;
  a string (a path or URL), any other name, or a table function (``read_parquet(...)``, and
  also harmless ones like ``generate_series(...)``: one rule is easier to trust) refuses it;
  ``unnest(...)`` still works in the select list;
- time travel, Delta/Spark style, right after a table name (or after its alias):
  ``rsvps.silver [FOR] VERSION AS OF 3`` and ``rsvps.silver [FOR] TIMESTAMP AS OF '2026-11-21T10:00:00Z'``
  (``SYSTEM_VERSION`` / ``SYSTEM_TIME`` are synonyms). A timestamp without an offset is UTC.

The engine also never gives DataFusion a way out: tables are registered one by one (URL tables are
off in delta-rs' session), and the statement it runs always starts with the guarded query. So a
reference the guard does not see as one (``(TABLE x)`` shorthand, a dialect corner) can only reach
a snapshot the guard registered or fail with "table not found"; it can never reach a file.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tidewater.errors import TidewaterError
from tidewater.query.catalog import TableRef


class QueryRefused(TidewaterError):
    """A SQL statement that may not or cannot run here; the message says why in one line."""


# ---- tokens ---------------------------------------------------------------------------------------

WORD, NUMBER, STRING, QIDENT, OP = "word", "number", "string", "ident", "op"
# Single-character operators passed through verbatim. Anything else (\, #, stray $) is refused:
# it could start a string or comment in some SQL dialect and make DataFusion see other code.
OPERATORS = frozenset("+-*/%=<>!|&^~,;()[]{}.:?@")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


@dataclass(frozen=True)
class Token:
    kind: str
    text: str  # as written
    value: str  # string content / identifier name (unquoted, unescaped) / the word itself
    pos: int  # offset in the statement, for messages
    space_before: bool = False  # whitespace or a comment separated it from the previous token

    def is_op(self, char: str) -> bool:
        return self.kind == OP and self.text == char

    @property
    def upper(self) -> str:
        return self.value.upper() if self.kind == WORD else ""

    def emit(self) -> str:
        """The token as the engine writes it: strings and quoted identifiers in one canonical form."""
        if self.kind == STRING:
            return "'" + self.value.replace("'", "''") + "'"
        if self.kind == QIDENT:
            return '"' + self.value.replace('"', '""') + '"'
        return self.text


def _syntax(message: str) -> QueryRefused:
    return QueryRefused(f"SQL error: {message}")


def tokenize(sql: str) -> list[Token]:
    """Split ``sql`` into tokens; whitespace and comments (``--``, nested ``/* */``) only set ``space_before``."""
    tokens: list[Token] = []
    i, n, space = 0, len(sql), False

    def add(kind: str, text: str, value: str, pos: int) -> None:
        nonlocal space
        tokens.append(Token(kind, text, value, pos, space))
        space = False

    while i < n:
        c = sql[i]
        if c.isspace():
            i, space = i + 1, True
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i, space = (n if end < 0 else end + 1), True
        elif sql.startswith("/*", i):
            i, space = _skip_block_comment(sql, i), True
        elif c == "'":
            end, value = _quoted(sql, i, "'", "string literal")
            _check_unprefixed(tokens, space, i)
            add(STRING, sql[i:end], value, i)
            i = end
        elif c in '"`':
            end, value = _quoted(sql, i, c, "quoted identifier")
            if not value:
                raise _syntax(f"empty quoted identifier at position {i}")
            add(QIDENT, sql[i:end], value, i)
            i = end
        elif c == "$":
            tag = _DOLLAR_TAG.match(sql, i)
            if tag is None:
                raise QueryRefused(
                    f"refused: unexpected character '$' at position {i} (placeholders are not supported)"
                )
            close = sql.find(tag.group(0), tag.end())
            if close < 0:
                raise _syntax(f"unterminated dollar-quoted string at position {i}")
            _check_unprefixed(tokens, space, i)
            add(STRING, sql[i : close + len(tag.group(0))], sql[tag.end() : close], i)
            i = close + len(tag.group(0))
        elif "0" <= c <= "9":
            match = _NUMBER.match(sql, i)
            assert match is not None
            add(NUMBER, match.group(0), match.group(0), i)
            i = match.end()
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (sql[j].isalpha() or "0" <= sql[j] <= "9" or sql[j] == "_"):
                j += 1
            add(WORD, sql[i:j], sql[i:j], i)
            i = j
        elif c in OPERATORS:
            add(OP, c, c, i)
            i += 1
        else:
            raise QueryRefused(f"refused: unexpected character {c!r} at position {i}")
    return tokens


def _skip_block_comment(sql: str, start: int) -> int:
    depth, i = 0, start
    while i < len(sql):
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise _syntax(f"unterminated /* comment at position {start}")


def _quoted(sql: str, start: int, quote: str, what: str) -> tuple[int, str]:
    """End offset and content of a quoted token; a doubled quote stands for one (no backslash escapes)."""
    parts, i = [], start + 1
    while True:
        end = sql.find(quote, i)
        if end < 0:
            raise _syntax(f"unterminated {what} at position {start}")
        parts.append(sql[i:end])
        if sql.startswith(quote * 2, end):
            parts.append(quote)
            i = end + 2
        else:
            return end + 1, "".join(parts)


def _check_unprefixed(tokens: list[Token], space: bool, pos: int) -> None:
    """E'..', R'..', U&'..' and friends carry escape rules of their own: refuse them (X'..' hex is fine)."""
    if space or not tokens:
        return
    prev = tokens[-1]
    if prev.kind == WORD and prev.upper == "X":
        return
    if prev.kind in (WORD, NUMBER, STRING, QIDENT) or prev.is_op("&"):
        raise QueryRefused(
            f"refused: prefixed string literal at position {prev.pos} ({prev.text}'...'); "
            "write a plain '...' string (a quote inside is doubled: 'it''s')"
        )


# ---- the guard ------------------------------------------------------------------------------------

WRITE_KEYWORDS = frozenset(
    {
        "INSERT",
        "UPDATE",
        "DELETE",
        "MERGE",
        "UPSERT",
        "REPLACE",
        "CREATE",
        "DROP",
        "ALTER",
        "RENAME",
        "COPY",
        "TRUNCATE",
        "INTO",
        "GRANT",
        "REVOKE",
        "VACUUM",
        "OPTIMIZE",
        "RESTORE",
        "UNLOAD",
        "ATTACH",
        "DETACH",
    }
)
SESSION_KEYWORDS = frozenset({"SET", "RESET"})
QUERY_STARTS = frozenset({"SELECT", "WITH", "VALUES"})
# Functions whose argument syntax contains FROM (EXTRACT(YEAR FROM ts), SUBSTRING(s FROM 2), ...).
FROM_SYNTAX_FUNCTIONS = frozenset({"EXTRACT", "SUBSTRING", "SUBSTR", "TRIM", "OVERLAY", "POSITION"})
# Words that end a FROM list (after them a comma no longer introduces a table).
FROM_LIST_END = frozenset(
    {
        "WHERE",
        "GROUP",
        "HAVING",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "UNION",
        "EXCEPT",
        "INTERSECT",
        "MINUS",
        "WINDOW",
        "QUALIFY",
        "FETCH",
        "SELECT",
        "VALUES",
    }
)
# Words that can follow a table but are not its alias.
NOT_ALIAS = FROM_LIST_END | {
    "JOIN",
    "INNER",
    "LEFT",
    "RIGHT",
    "FULL",
    "OUTER",
    "CROSS",
    "NATURAL",
    "SEMI",
    "ANTI",
    "ON",
    "USING",
    "LATERAL",
    "TABLESAMPLE",
    "VERSION",
    "TIMESTAMP",
    "SYSTEM_VERSION",
    "SYSTEM_TIME",
    "FOR",
    "PIVOT",
    "UNPIVOT",
    "AS",
}


@dataclass(frozen=True)
class TimeTravel:
    """``VERSION AS OF n`` or ``TIMESTAMP AS OF '...'`` as written after a table."""

    version: int | None = None
    timestamp: dt.datetime | None = None  # timezone-aware (UTC when the text had no offset)
    text: str = ""  # e.g. "VERSION AS OF 3", for messages and the result's table list


@dataclass(frozen=True)
class TableUse:
    """One reference to a lake table in the query."""

    ref: TableRef
    as_of: TimeTravel | None = None

    @property
    def label(self) -> str:
        return self.ref.name if self.as_of is None else f"{self.ref.name} {self.as_of.text}"


@dataclass(frozen=True)
class GuardedQuery:
    """A statement the guard accepted: the lake tables it reads, and how to write it for DataFusion."""

    tokens: tuple[Token, ...]  # the query body (no EXPLAIN prefix, no trailing ';')
    uses: tuple[TableUse, ...]
    explain: tuple[str, ...] = ()  # ("EXPLAIN",) or ("EXPLAIN", "ANALYZE", ...) when the statement explains
    # token index -> (end index, use index or -1 to drop, default alias or "")
    replacements: Mapping[int, tuple[int, int, str]] = field(default_factory=dict)
    top_level_limit: bool = False  # the query has its own LIMIT/OFFSET at the outermost level

    def render(self, names: Sequence[str]) -> str:
        """The query body with table ``uses[i]`` written as the registered table ``names[i]``."""
        out: list[str] = []
        i, pending_space = 0, False
        while i < len(self.tokens):
            token = self.tokens[i]
            sep = " " if (token.space_before or pending_space) and out else ""
            pending_space = False
            if i in self.replacements:
                end, use, alias = self.replacements[i]
                if use >= 0:
                    text = '"' + names[use].replace('"', '""') + '"'
                    if alias:
                        text += ' AS "' + alias.replace('"', '""') + '"'
                    out.append(sep + text)
                else:  # a dropped clause still separates its neighbours
                    pending_space = True
                i = end
                continue
            out.append(sep + token.emit())
            i += 1
        return "".join(out)


Resolver = Callable[[Sequence[str]], TableRef | None]


def guard(sql: str, *, resolve: Resolver, known: Sequence[str]) -> GuardedQuery:
    """Accept ``sql`` as one read-only query over lake tables, or raise :class:`QueryRefused`.

    ``resolve`` maps a dotted table name (parts, unquoted ones lower-cased) to a lake table or None;
    ``known`` are the names listed in messages.
    """
    tokens = tokenize(sql)
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token.is_op(";"):
            statements.append([])
        else:
            statements[-1].append(token)
    statements = [s for s in statements if s]
    if not statements:
        raise QueryRefused("refused: the query is empty; write one SELECT statement")
    if len(statements) > 1:
        raise QueryRefused(
            f"refused: one statement at a time (found {len(statements)}); remove everything after the first ';'"
        )
    body = statements[0]
    _check_keywords(body)
    explain: list[str] = []
    if body[0].upper == "EXPLAIN":
        explain.append("EXPLAIN")
        body = body[1:]
        while body and body[0].upper in ("ANALYZE", "VERBOSE"):
            explain.append(body[0].upper)
            body = body[1:]
    if not body or not (body[0].upper in QUERY_STARTS or body[0].is_op("(")):
        found = body[0].text.upper() if body else "nothing"
        raise QueryRefused(
            f"refused: only read statements (SELECT/WITH/VALUES, or EXPLAIN of one) run here; this statement is {found}"
        )
    return _Walker(body, resolve, known).walk(tuple(explain))


def _check_keywords(body: Sequence[Token]) -> None:
    for i, token in enumerate(body):
        word = token.upper
        if not word or _in_name(body, i):
            continue
        if word == "REPLACE" and i + 1 < len(body) and body[i + 1].is_op("("):
            continue  # the replace(text, from, to) function
        if word in WRITE_KEYWORDS:
            what = "SELECT INTO" if word == "INTO" and not _any_word(body[:i], "INSERT") else word
            raise QueryRefused(
                f"refused: only read statements (SELECT/WITH) run here; this statement writes ({what})"
                + (f' - if {token.text} is a column name, quote it: "{token.text}"' if word != "INTO" else "")
            )
        if word in SESSION_KEYWORDS:
            raise QueryRefused(
                "refused: only read statements (SELECT/WITH) run here; "
                f"this statement changes session settings ({word})"
            )


def _any_word(tokens: Sequence[Token], word: str) -> bool:
    return any(t.upper == word for t in tokens)


def _in_name(tokens: Sequence[Token], i: int) -> bool:
    """A word next to a '.' is part of a dotted name (t.update), never a keyword."""
    return (i > 0 and tokens[i - 1].is_op(".")) or (i + 1 < len(tokens) and tokens[i + 1].is_op("."))


@dataclass
class _Scope:
    """One level of parentheses while walking the query."""

    from_list: bool = False  # inside a FROM list: a comma introduces another table
    expect_table: bool = False  # the next item is a table reference
    syntax_from: bool = False  # parentheses of EXTRACT(... FROM ...) and friends: FROM is no table


class _Walker:
    def __init__(self, tokens: Sequence[Token], resolve: Resolver, known: Sequence[str]) -> None:
        self.q = list(tokens)
        self.resolve = resolve
        self.known = list(known)
        self.uses: list[TableUse] = []
        self.replacements: dict[int, tuple[int, int, str]] = {}
        self.close = self._match_parens()
        self.ctes = self._cte_names()

    # -- structure ---------------------------------------------------------------------------------

    def _match_parens(self) -> dict[int, int]:
        stack: list[int] = []
        close: dict[int, int] = {}
        for i, token in enumerate(self.q):
            if token.is_op("("):
                stack.append(i)
            elif token.is_op(")"):
                if not stack:
                    raise _syntax(f"unbalanced ')' at position {token.pos}")
                close[stack.pop()] = i
        if stack:
            raise _syntax(f"unbalanced '(' at position {self.q[stack[-1]].pos}")
        return close

    def _cte_names(self) -> set[str]:
        """Names defined by WITH [RECURSIVE] name [(cols)] AS [NOT] [MATERIALIZED] (...) [, ...]."""
        names: set[str] = set()
        q = self.q
        for w, token in enumerate(q):
            if token.upper != "WITH" or _in_name(q, w):
                continue
            j = w + 1
            if j < len(q) and q[j].upper == "RECURSIVE":
                j += 1
            while j < len(q) and q[j].kind in (WORD, QIDENT):
                name = self._part(q[j])
                j += 1
                if j < len(q) and q[j].is_op("("):
                    j = self.close[j] + 1
                if not (j < len(q) and q[j].upper == "AS"):
                    break
                j += 1
                while j < len(q) and q[j].upper in ("NOT", "MATERIALIZED"):
                    j += 1
                if not (j < len(q) and q[j].is_op("(")):
                    break
                names.add(name)
                j = self.close[j] + 1
                if not (j < len(q) and q[j].is_op(",")):
                    break
                j += 1
        return names

    @staticmethod
    def _part(token: Token) -> str:
        return token.value.lower() if token.kind == WORD else token.value

    # -- the walk ----------------------------------------------------------------------------------

    def walk(self, explain: tuple[str, ...]) -> GuardedQuery:
        q = self.q
        stack = [_Scope()]
        top_level_limit = False
        i = 0
        while i < len(q):
            token, scope = q[i], stack[-1]
            if token.is_op("("):
                prev = q[i - 1] if i else None
                if scope.expect_table:  # a derived table or a parenthesised join
                    scope.expect_table = False
                    stack.append(_Scope(from_list=True, expect_table=True))
                elif prev is not None and prev.upper in FROM_SYNTAX_FUNCTIONS and not _in_name(q, i - 1):
                    stack.append(_Scope(syntax_from=True))
                else:
                    stack.append(_Scope())
                i += 1
                continue
            if token.is_op(")"):
                stack.pop()
                i += 1
                continue
            if scope.expect_table:
                i = self._table_item(i, scope)
                continue
            word = "" if _in_name(q, i) else token.upper
            if word == "FROM" and not scope.syntax_from and not self._distinct_from(i):
                scope.from_list = scope.expect_table = True
            elif word == "JOIN":
                scope.expect_table = True
            elif word in FROM_LIST_END:
                scope.from_list = False
                if len(stack) == 1 and word in ("LIMIT", "OFFSET"):
                    top_level_limit = True
            elif token.is_op(",") and scope.from_list:
                scope.expect_table = True
            i += 1
        if stack[-1].expect_table:
            raise _syntax("a table name is missing at the end of the query")
        return GuardedQuery(
            tokens=tuple(q),
            uses=tuple(self.uses),
            explain=explain,
            replacements=dict(self.replacements),
            top_level_limit=top_level_limit,
        )

    def _distinct_from(self, i: int) -> bool:
        """``a IS [NOT] DISTINCT FROM b`` compares values; its FROM names no table."""
        q = self.q
        if not (i > 1 and q[i - 1].upper == "DISTINCT"):
            return False
        return q[i - 2].upper == "IS" or (i > 2 and q[i - 2].upper == "NOT" and q[i - 3].upper == "IS")

    def _table_item(self, i: int, scope: _Scope) -> int:
        """Check the table reference starting at ``i``; return where the walk continues."""
        q = self.q
        token = q[i]
        if token.upper in QUERY_STARTS:  # (SELECT ...) in a FROM: a subquery, walked as a query
            scope.expect_table = scope.from_list = False
            return i
        if token.upper == "LATERAL":
            return i + 1
        if token.kind == STRING:
            raise QueryRefused(f"refused: only lake tables can be read ({self._known()}); '{token.value}' is not one")
        if token.kind not in (WORD, QIDENT):
            raise QueryRefused(f"refused: expected a lake table at position {token.pos}, found {token.text!r}")
        parts, j = self._name(i)
        written = ".".join(parts)
        if j < len(q) and q[j].is_op("("):
            raise QueryRefused(
                f"refused: only lake tables can be read ({self._known()}); {written}(...) is a table function, not one"
            )
        scope.expect_table = False
        if len(parts) == 1 and parts[0] in self.ctes:
            travel, k = self._time_travel(j)
            if travel is not None:
                raise QueryRefused(f"refused: {travel.text} applies to lake tables only; {written} is a CTE")
            return j
        lookup = parts[0].split(".") if len(parts) == 1 and q[i].kind == QIDENT else parts
        ref = self.resolve(lookup)
        if ref is None:
            raise QueryRefused(
                f"refused: unknown table {written}; lake tables: {self._known()} "
                "(another namespace: <namespace>.<pipeline>.<table>)"
            )
        travel, k = self._time_travel(j)
        alias_end = self._alias_end(k)
        drop_end = alias_end
        if travel is None and alias_end > k:  # FROM rsvps.silver s VERSION AS OF 3
            travel, drop_end = self._time_travel(alias_end)
            if travel is not None:
                self.replacements[alias_end] = (drop_end, -1, "")
        default_alias = "" if alias_end > k else lookup[-1]
        self.replacements[i] = (k, len(self.uses), default_alias)
        self.uses.append(TableUse(ref=ref, as_of=travel))
        return drop_end

    def _name(self, i: int) -> tuple[list[str], int]:
        q = self.q
        parts = [self._part(q[i])]
        j = i + 1
        while j + 1 < len(q) and q[j].is_op(".") and q[j + 1].kind in (WORD, QIDENT):
            parts.append(self._part(q[j + 1]))
            j += 2
        return parts, j

    def _alias_end(self, k: int) -> int:
        q = self.q
        if k >= len(q):
            return k
        if q[k].upper == "AS" and k + 1 < len(q) and q[k + 1].kind in (WORD, QIDENT):
            return k + 2
        if q[k].kind == QIDENT or (q[k].kind == WORD and q[k].upper not in NOT_ALIAS):
            return k + 1
        return k

    def _time_travel(self, k: int) -> tuple[TimeTravel | None, int]:
        q = self.q
        j = k + 1 if k < len(q) and q[k].upper == "FOR" else k
        if not (j + 3 < len(q) and q[j + 1].upper == "AS" and q[j + 2].upper == "OF"):
            return None, k
        kind, value = q[j].upper, q[j + 3]
        if kind in ("VERSION", "SYSTEM_VERSION"):
            if value.kind != NUMBER or not value.text.isdigit():
                raise QueryRefused(
                    "refused: VERSION AS OF takes a version number, e.g. rsvps.silver VERSION AS OF 3 "
                    f"(found {value.text})"
                )
            version = int(value.text)
            return TimeTravel(version=version, text=f"VERSION AS OF {version}"), j + 4
        if kind in ("TIMESTAMP", "SYSTEM_TIME"):
            end = j + 4
            if value.upper == "TIMESTAMP" and end < len(q) and q[end].kind == STRING:  # TIMESTAMP '...'
                value, end = q[end], end + 1
            if value.kind != STRING:
                raise QueryRefused(
                    "refused: TIMESTAMP AS OF takes a quoted ISO-8601 time, "
                    f"e.g. rsvps.silver TIMESTAMP AS OF '2026-11-21T10:00:00Z' (found {value.text})"
                )
            when = parse_timestamp(value.value)
            return TimeTravel(timestamp=when, text=f"TIMESTAMP AS OF '{when.isoformat()}'"), end
        return None, k

    def _known(self) -> str:
        return ", ".join(self.known)


def parse_timestamp(text: str) -> dt.datetime:
    """ISO-8601 date or date-time; no offset means UTC."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise QueryRefused(
            f"refused: TIMESTAMP AS OF '{text}' is not an ISO-8601 time; write e.g. '2026-11-21T10:00:00Z'"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
