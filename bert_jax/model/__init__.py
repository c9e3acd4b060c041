"""The model: `BertConfig` and presets, the encoder, and the heads with their losses."""
