"""The ``fleetmedic`` command line: :mod:`.main` builds the parser; one module per subcommand;
:mod:`.common` holds what they share."""
