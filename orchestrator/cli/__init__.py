"""The `bcrit` command line: `main.py` builds the parser from one `<name>_cmd.py` per sub-command; options shared by
several commands are defined once in `options.py`."""
