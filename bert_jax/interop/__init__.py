"""Checkpoints in and out: the name tables (`names`), the Hugging Face and TF1 formats (`hf`,
`tf1`), and checkpoint resolution with the init order (`checkpoints`)."""
