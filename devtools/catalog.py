"""A fingerprint of what an install's code is, read from the catalog.

Every revision ships its code as a patch chain (see
``runrelay._migrations.codetree``); the fingerprint proves, independently of
that storage, what a migrated database ends up with. It covers, for the
install's schema:

* every function: its name and arguments (with defaults) and result type,
  ``prosrc``, language, ``proretset``, volatility, ``SECURITY DEFINER``,
  ``proconfig``, ACL and comment;
* every view: columns, definition, ACL, comment;
* every composite type: attributes and their types, comment;
* every table and sequence: ACL (their columns belong to the schema, not to
  the code, and the deltas are checked by other tests).

It is independent of the schema name, the migrating role and the PostgreSQL
major version (15 and 18 give the same checksum):

* the schema name becomes ``<schema>`` wherever the catalog prints it
  (qualified type names, ``search_path`` settings, role names
  ``<schema>_worker`` ...), the object owner (the role that ran the migration)
  ``<owner>``; function bodies (``prosrc``) are compared verbatim;
* the ``MAINTAIN`` privilege is left out of ACLs: PostgreSQL 17 added it, and
  owners hold it implicitly there;
* view definitions lose their range-variable qualifiers and layout:
  PostgreSQL 16 stopped qualifying the columns of a single-relation FROM
  (15 prints ``r.queue``, 18 ``queue``). The view's columns and their types
  are fingerprinted besides.

``checksum()`` is what ``frozen/RELEASED`` records per released revision and
what tests/python/test_revisions.py compares after every step of a full
upgrade and downgrade replay.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import psycopg

_FUNCTIONS = """
SELECT
    p.proname || '(' || pg_catalog.pg_get_function_arguments(p.oid) || ')',
    pg_catalog.pg_get_function_result(p.oid),
    l.lanname,
    p.prosrc,
    p.proretset,
    p.provolatile,
    p.prosecdef,
    p.proconfig,
    p.proowner::regrole::text,
    (SELECT array_agg(
                format('%%s>%%s:%%s%%s', a.grantor::regrole, coalesce(r.rolname, 'PUBLIC'),
                       a.privilege_type, CASE WHEN a.is_grantable THEN '*' ELSE '' END)
                ORDER BY 1)
       FROM aclexplode(p.proacl) AS a
       LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee),
    p.proacl IS NULL,
    pg_catalog.obj_description(p.oid, 'pg_proc')
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
WHERE p.pronamespace = %(schema)s::regnamespace
"""

_RELATIONS = """
SELECT
    c.relname,
    c.relkind::text,
    c.relowner::regrole::text,
    (SELECT array_agg(
                format('%%s>%%s:%%s%%s', a.grantor::regrole, coalesce(r.rolname, 'PUBLIC'),
                       a.privilege_type, CASE WHEN a.is_grantable THEN '*' ELSE '' END)
                ORDER BY 1)
       FROM aclexplode(c.relacl) AS a
       LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee),
    c.relacl IS NULL,
    CASE WHEN c.relkind = 'v' THEN pg_catalog.pg_get_viewdef(c.oid, true) END,
    CASE WHEN c.relkind IN ('v', 'c') THEN (
        SELECT array_agg(
                   att.attname || ' ' || pg_catalog.format_type(att.atttypid, att.atttypmod)
                   ORDER BY att.attnum)
        FROM pg_catalog.pg_attribute AS att
        WHERE att.attrelid = c.oid AND att.attnum > 0 AND NOT att.attisdropped
    ) END,
    CASE WHEN c.relkind IN ('v', 'c') THEN pg_catalog.obj_description(c.oid, 'pg_class') END,
    CASE WHEN c.relkind = 'c' THEN (
        SELECT pg_catalog.obj_description(t.oid, 'pg_type')
        FROM pg_catalog.pg_type AS t WHERE t.typrelid = c.oid
    ) END
FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = %(schema)s::regnamespace
  AND c.relkind IN ('r', 'p', 'S', 'v', 'c')
"""


def fingerprint(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """The install's code as plain data, normalised as the module docstring says."""
    with conn.transaction():
        # Unqualified type names for the install's own types, as on any schema name.
        conn.execute(f'SET LOCAL search_path TO "{schema}", pg_catalog')
        functions = conn.execute(_FUNCTIONS, {"schema": schema}).fetchall()
        relations = conn.execute(_RELATIONS, {"schema": schema}).fetchall()
    out: dict[str, Any] = {"functions": {}, "views": {}, "types": {}, "grants": {}}
    for (
        sig,
        result,
        lang,
        src,
        retset,
        vol,
        secdef,
        config,
        owner,
        acl,
        no_acl,
        comment,
    ) in functions:
        norm = _normaliser(schema, owner)
        out["functions"][norm(sig)] = {
            "result": norm(result),
            "language": lang,
            "prosrc": src,
            "retset": retset,
            "volatility": vol,
            "security_definer": secdef,
            "config": [norm(c) for c in config or []],
            "acl": None if no_acl else sorted(norm(a) for a in acl or []),
            "comment": comment,
        }
    for name, kind, owner, acl, no_acl, viewdef, columns, comment, type_comment in relations:
        norm = _normaliser(schema, owner)
        acl_value = None if no_acl else sorted(norm(a) for a in acl or [] if ":MAINTAIN" not in a)
        if kind == "v":
            out["views"][name] = {
                "definition": _viewdef(norm(viewdef)),
                "columns": [norm(c) for c in columns],
                "acl": acl_value,
                "comment": comment,
            }
        elif kind == "c":
            out["types"][name] = {
                "attributes": [norm(c) for c in columns],
                "comment": type_comment or comment,
            }
        else:
            out["grants"][f"{kind}:{name}"] = acl_value
    return out


def checksum(fp: dict[str, Any]) -> str:
    """sha256 of the fingerprint's canonical JSON."""
    text = json.dumps(fp, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _viewdef(text: str) -> str:
    """A view definition without range-variable qualifiers and layout.

    PostgreSQL 16 stopped qualifying columns of a single-relation FROM
    (``r.queue`` became ``queue``); stripping every ``alias.`` makes 15 and 18
    agree, and the view's column list and types are fingerprinted besides.
    """
    return " ".join(_QUALIFIER.sub("", text).split())


# Not inside a string literal: 'runrelay.clock_offset' is a setting's name.
_QUALIFIER = re.compile(r"(?<![\w$<>.'])[a-z_][a-z0-9_$]*\.(?=[a-z_\"])")


def _normaliser(schema: str, owner: str) -> Any:
    owner_re = re.compile(rf"(?<![\w$]){re.escape(owner.strip(chr(34)))}(?![\w$])")
    # Not at the start of a string literal: a setting's name
    # ('runrelay.clock_offset') does not follow the schema's.
    schema_re = re.compile(rf"(?<![\w$']){re.escape(schema)}(?=[. ,]|$)")

    def norm(text: str) -> str:
        # Role names first: <schema>_worker must not become <owner>-anything.
        text = re.sub(
            rf"(?<![\w$]){re.escape(schema)}_(producer|worker|relay|admin)\b", r"<schema>_\1", text
        )
        text = owner_re.sub("<owner>", text)
        text = schema_re.sub("<schema>", text)
        return text.replace(f'"{schema}"', "<schema>")

    return norm
