"""`python -m data_prep.train_tokenizer`: a corpus without text is refused by name for every
model type (it would have written a vocabulary of the special tokens alone and exited 0), and a
vocabulary smaller than asked for says so."""

import pytest

from data_prep import demo_corpus
from tests import helpers


@pytest.mark.parametrize("model_type", ["wordpiece", "byte_bpe", "unigram"])
@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"])
def test_a_corpus_without_text_is_refused(model_type, content, tmp_path):
  corpus = tmp_path / "empty.txt"
  corpus.write_text(content, encoding="utf-8")
  proc = helpers.run_command("data_prep.train_tokenizer", f"--input_file={corpus}",
                             f"--output_prefix={tmp_path / 'vocab'}", f"--model_type={model_type}",
                             "--vocab_size=100")
  assert proc.returncode == 1
  (line,) = proc.stderr.strip().splitlines()
  assert str(corpus) in line and "no text" in line
  assert [p.name for p in tmp_path.iterdir()] == ["empty.txt"]  # nothing written


def test_a_vocabulary_smaller_than_asked_says_so(tmp_path):
  corpus = tmp_path / "small.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=20_000), encoding="utf-8")
  proc = helpers.run_command("data_prep.train_tokenizer", f"--input_file={corpus}",
                             f"--output_prefix={tmp_path / 'wp'}", "--model_type=wordpiece",
                             "--vocab_size=100000")
  assert proc.returncode == 0, proc.stderr
  size = sum(1 for _ in open(tmp_path / "wp.vocab.txt", encoding="utf-8"))
  assert size < 100_000
  assert f"note: --vocab_size=100,000 asked for more tokens than the corpus yields: {size:,}" \
      in proc.stdout
  proc = helpers.run_command("data_prep.train_tokenizer", f"--input_file={corpus}",
                             f"--output_prefix={tmp_path / 'wp2'}", "--model_type=wordpiece",
                             f"--vocab_size={size // 2}")
  assert proc.returncode == 0 and "note:" not in proc.stdout
  assert sum(1 for _ in open(tmp_path / "wp2.vocab.txt", encoding="utf-8")) == size // 2
