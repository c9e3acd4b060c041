"""Text: tokenizers, the pre-training TFRecord schema, the masking rules, and text pairs as
model inputs."""
