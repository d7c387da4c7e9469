"""The YAML a user writes, validated before anything runs: `--set` overrides, the sweep spec, its adaptive keys, the
branched-study spec."""
