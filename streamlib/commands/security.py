"""Security commands: who holds which role, and tokens.

    streamlib admin principals grant NAME ROLE [ROLE ...]   read | write | admin | bookie
    streamlib admin principals grant NAME consume STREAM/SUB [...]   one subscription (or
                                                            a prefix: orders/*), brokers only
    streamlib admin principals revoke NAME [ROLE ...]       all roles when none is named
    streamlib admin principals revoke NAME consume [STREAM/SUB ...]   (all grants: none named)
    streamlib admin principals list [--json]
    streamlib token create-secret --output FILE             a new HS256 key (file 0600)
    streamlib token create --secret-file FILE --subject NAME [--expires-in SECONDS]

The principal map lives in the metadata store (metadata/services/principals.py); every
authenticating bookie and broker follows it, and the brokers the grants beside it
(streamlib/protocol/service_access.py says what each role and grant allows there). Tokens are printed on stdout, for a file or a secret
store -- hand them to clients through STREAMLIB_TOKEN / STREAMLIB_TOKEN_FILE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from metadata.services.principals import ROLES, PrincipalRoles, SubscriptionGrants
from streamlib.commands.common import (
    Subparsers,
    add_common,
    fail,
    print_json,
    print_table,
    run_with_client,
)

if TYPE_CHECKING:
    from streamlib.client import Client


def add_parsers(commands: Subparsers, admin_commands: Subparsers) -> None:
    group = admin_commands.add_parser("principals", help="roles of principals (authorization)")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    grant = actions.add_parser("grant", help="give a principal roles")
    grant.add_argument("principal", help="a token's subject or a certificate's common name")
    grant.add_argument(
        "roles",
        nargs="+",
        metavar="ROLE",
        help=f"{'/'.join(ROLES)}; or consume STREAM/SUB ... (a subscription, or a prefix ending in *)",
    )
    add_common(grant)
    grant.set_defaults(run=run_with_client(_grant, direct_only=True))
    revoke = actions.add_parser("revoke", help="take roles (default: all) from a principal")
    revoke.add_argument("principal")
    revoke.add_argument(
        "roles", nargs="*", metavar="ROLE", help=f"{'/'.join(ROLES)}; or consume [STREAM/SUB ...]"
    )
    add_common(revoke)
    revoke.set_defaults(run=run_with_client(_revoke, direct_only=True))
    listing = actions.add_parser("list", help="every principal and its roles")
    add_common(listing)
    listing.set_defaults(run=run_with_client(_list, direct_only=True))

    token = commands.add_parser("token", help="make token keys and tokens (JWT)")
    token_actions = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    secret = token_actions.add_parser("create-secret", help="a new HS256 secret key file")
    secret.add_argument("--output", type=Path, required=True, help="the file to write (0600)")
    secret.set_defaults(run=_create_secret)
    create = token_actions.add_parser("create", help="a token for a principal, on stdout")
    create.add_argument("--secret-file", type=Path, required=True, help="the HS256 secret key")
    create.add_argument("--subject", required=True, help="the principal the token names")
    create.add_argument(
        "--expires-in", type=float, metavar="SECONDS", help="lifetime (default: no expiry)"
    )
    create.set_defaults(run=_create_token)


def _consume_grants(words: list[str]) -> list[str] | None:
    """The grants of `consume STREAM/SUB ...`; None when words are roles."""
    if not words or words[0] != "consume":
        unknown = sorted(set(words) - set(ROLES))
        if unknown:
            raise ValueError(
                f"unknown role(s) {unknown}: the roles are {', '.join(ROLES)}, "
                "or `consume STREAM/SUB` grants one subscription"
            )
        return None
    return words[1:]


async def _grant(client: Client, args: argparse.Namespace) -> int:
    try:
        grants = _consume_grants(args.roles)
    except ValueError as e:
        return fail(str(e), code=2)  # (a usage error, as argparse's)
    if grants is None:
        roles = await PrincipalRoles(client.store).grant(args.principal, args.roles)
        _show(args, args.principal, roles)
        return 0
    if not grants:
        return fail("grant NAME consume needs STREAM/SUB (or a prefix ending in *)", code=2)
    _show(
        args,
        args.principal,
        await SubscriptionGrants(client.store).grant(args.principal, grants),
        "consume",
    )
    return 0


async def _revoke(client: Client, args: argparse.Namespace) -> int:
    try:
        grants = _consume_grants(args.roles)
    except ValueError as e:
        return fail(str(e), code=2)
    if grants is None:
        roles = await PrincipalRoles(client.store).revoke(args.principal, args.roles or None)
        _show(args, args.principal, roles)
        return 0
    left = await SubscriptionGrants(client.store).revoke(args.principal, grants or None)
    _show(args, args.principal, left, "consume")
    return 0


def _show(
    args: argparse.Namespace, principal: str, names: tuple[str, ...], what: str = "roles"
) -> None:
    if args.json:
        print_json({"principal": principal, what: list(names)})
    else:
        label = "" if what == "roles" else f"{what} "
        print(f"{principal}: {label}{' '.join(names) or f'(no {what})'}")


async def _list(client: Client, args: argparse.Namespace) -> int:
    principals, _ = await PrincipalRoles(client.store).read()
    grants, _ = await SubscriptionGrants(client.store).read()
    names = sorted({*principals, *grants})
    if args.json:
        print_json({p: list(principals.get(p, ())) for p in sorted(principals)})
    elif not names:
        print("no principal has a role")
    else:
        print_table(
            ["principal", "roles", "consume"],
            [(p, " ".join(principals.get(p, ())), " ".join(grants.get(p, ()))) for p in names],
        )
    return 0


def _create_secret(args: argparse.Namespace) -> int:
    import os

    from streamlib.security import new_secret_key

    try:  # O_EXCL: never replaces a key (that would invalidate every token it signed)
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return fail(f"{args.output} exists: a new key would invalidate every token it signed")
    except OSError as e:
        return fail(f"cannot write {args.output}: {e.strerror}")
    with os.fdopen(fd, "wb") as f:
        f.write(new_secret_key())
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _create_token(args: argparse.Namespace) -> int:
    from streamlib.security import make_token, read_secret_file

    try:
        key = read_secret_file(args.secret_file, "secret key file")
    except ValueError as e:
        return fail(str(e))
    if args.expires_in is not None and args.expires_in <= 0:
        return fail("--expires-in must be > 0")
    print(make_token(key.encode(), args.subject, expires_in_s=args.expires_in))
    return 0
