"""Checkpoints in and out: the name tables (`names`), the Hugging Face and TF1 formats (`hf`,
`tf1`), foreign `config.json` files ↔ our config (`hf_config`), and checkpoint resolution with
the init order (`checkpoints`)."""
