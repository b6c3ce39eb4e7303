"""``fleetmedic kafka acls``: the ``kafka-acls`` commands that give each component what it needs.

Prints, for the topic names and consumer groups of ``--config``, one ``kafka-acls.sh --add``
command per grant each component as its own principal
(``--principal-prefix`` followed by the component's name, or ``--principal COMPONENT=PRINCIPAL``).
Run them as a Kafka admin (``--command-config`` names that client's properties file).
"""

from __future__ import annotations

import argparse
import sys

from fleetmedic import acls
from fleetmedic.bus import COMPONENTS
from fleetmedic.cli.common import EXIT_INVALID, add_deprecated_alias, examples, settings_or_none


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kafka", help="Kafka administration: the ACLs each component needs",
                       epilog=examples("fleetmedic kafka acls --config my.yaml"))
    verbs = p.add_subparsers(dest="kafka_command", metavar="ACTION")
    verbs.required = True
    text = "print the kafka-acls commands that grant each component (workers, executor, connectors, ctl, " \
           "subscribers) the topics and consumer groups it reads, writes and creates"
    a = verbs.add_parser("acls", help=text, description=text + ". Components: " + ", ".join(COMPONENTS) + ".",
                         epilog=examples("fleetmedic kafka acls --config my.yaml",
                                         "fleetmedic kafka acls --config my.yaml --bootstrap broker-0:9093 "
                                         "--principal executor=User:CN=fleetmedic-executor"))
    a.add_argument("--config", metavar="FILE",
                   help="fleetmedic config (topic names, consumer groups, exporters' source topics)")
    a.add_argument("--principal-prefix", default=acls.DEFAULT_PRINCIPAL_PREFIX,
                   help="each component's principal is this followed by its name (default: %(default)s)")
    a.add_argument("--principal", action="append", default=[], metavar="COMPONENT=PRINCIPAL",
                   help="one component's principal, e.g. executor=User:CN=fleetmedic-executor (repeatable)")
    a.add_argument("--subscriber-group", default=acls.DEFAULT_SUBSCRIBER_GROUP,
                   help="the consumer group a subscriber reads in (default: %(default)s)")
    a.add_argument("--bootstrap", dest="bootstrap_server", default="$KAFKA", metavar="HOST:PORT[,HOST:PORT]",
                   help="the brokers written into each command (default: %(default)s)")
    add_deprecated_alias(a, "--bootstrap-server", "bootstrap_server")
    a.add_argument("--command-config", default="admin.properties",
                   help="the admin client's properties file, written into each command ('' for none; "
                        "default: %(default)s)")
    a.set_defaults(handler=run_acls)


def run_acls(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    overrides: dict[str, str] = {}
    for item in args.principal:
        component, sep, principal = item.partition("=")
        if not sep:
            print(f"error: --principal {item!r}: expected COMPONENT=PRINCIPAL", file=sys.stderr)
            return EXIT_INVALID
        overrides[component.strip()] = principal.strip()
    try:
        principals = acls.principals(args.principal_prefix, overrides)
    except ValueError as exc:
        print(f"error: --principal: {exc}", file=sys.stderr)
        return EXIT_INVALID
    sys.stdout.write(acls.script(settings, principals, args.bootstrap_server, args.command_config,
                                 args.subscriber_group))
    return 0
