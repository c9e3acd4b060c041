"""Run configs (ml_collections): `--config=configs/pretrain.py:<variant>`, `configs/glue.py:<task>`,
`configs/squad.py:<v1|v2>`. Installed with the package as `bert_jax.configs`, so the documented
`--config=configs/...` paths work from any directory (`bert_jax.cli.resolve_config_argument`)."""
