"""Data: TFRecords and in-memory features → resumable streams of global, sharded batches."""
