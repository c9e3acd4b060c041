"""RoBERTa, ALBERT and ELECTRA downstream: fill-mask, GLUE and SQuAD through the same commands
as BERT, from a Hugging Face directory (`model_type` read from its `config.json`, the vocabulary
found beside it) and from our own pre-training workdirs, with no vocabulary flag anywhere.

The Hugging Face directories are what `save_pretrained` writes for transformers' PyTorch models
with random weights, plus each family's tokenizer files trained on Shakespeare (RoBERTa's
`vocab.json` + `merges.txt`, ALBERT's `spiece.model` and `tokenizer_config.json`). Inputs are
checked against transformers' tokenizers built from the same directory; fill-mask probabilities
against the PyTorch model.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch
import transformers

from bert_jax import inference
from bert_jax.interop import checkpoints
from bert_jax.runs import pretraining
from bert_jax.tasks.squad import data as squad
from bert_jax.text import bpe, sentencepiece_tokenizer, vocab_files
from data_prep import create_pretraining_data as cpd
from data_prep import train_tokenizer
from tests import pretrain_helpers as ph
from tests.task_helpers import sst2_dir as _sst2_dir
from tests.task_helpers import OFFICIAL
from tests import helpers

VOCAB_SIZE = 1000
# Tiny models: the route is tested, not the model. No dropout, so a few epochs memorise SST-2.
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FAMILIES = ["roberta", "albert"]
MASKED = ["the king shall [MASK] to-morrow.", "[MASK] you, good my lord, and [MASK] well."]


def _cli(module, *args):
  proc = helpers.run_command(module, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _squad_cli(directory, tmp_path):
  """SQuAD v1.1 fine-tuning and prediction on the memorised set from `directory`, through the
  command line; returns the output directory."""
  data = str(tmp_path / "train-v1.1.json")
  with open(data, "w") as f:
    json.dump(OFFICIAL, f)
  out = str(tmp_path / "squad")
  _cli("bert_jax.finetune", "--task_name=squad", f"--train_file={data}",
       f"--predict_file={data}", f"--init_checkpoint={directory}", f"--output_dir={out}",
       "--do_train", "--do_predict", "--max_seq_length=64", "--doc_stride=24",
       "--max_query_length=16", "--train_batch_size=8", "--learning_rate=3e-3",
       "--num_train_epochs=40")
  return out


@pytest.fixture(scope="module")
def hf_dirs(plays_corpus, tmp_path_factory):
  """family → (Hugging Face directory, transformers masked-LM model, transformers tokenizer)."""
  out = {}
  torch.manual_seed(0)
  # RoBERTa: byte-level BPE files under their released names.
  rb_dir = str(tmp_path_factory.mktemp("hf_roberta"))
  vocab_file, merges_file = train_tokenizer.train_byte_level_bpe(
      [plays_corpus], str(tmp_path_factory.mktemp("rb") / "rb"), VOCAB_SIZE)
  shutil.copy(vocab_file, os.path.join(rb_dir, "vocab.json"))
  shutil.copy(merges_file, os.path.join(rb_dir, "merges.txt"))
  size = len(json.load(open(vocab_file, encoding="utf-8")))
  model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
      vocab_size=size, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
      bos_token_id=0, eos_token_id=2, attn_implementation="eager", **SIZES)).eval()
  model.save_pretrained(rb_dir, safe_serialization=True)
  reference = transformers.RobertaTokenizer.from_pretrained(rb_dir)
  assert len(reference) == size
  out["roberta"] = (rb_dir, model, reference)
  # ALBERT: an spiece.model in ALBERT's layout; uncased, as its tokenizer_config.json says.
  al_dir = str(tmp_path_factory.mktemp("hf_albert"))
  spm_model = train_tokenizer.train_sentencepiece(
      [plays_corpus], str(tmp_path_factory.mktemp("al") / "spiece"), "unigram", VOCAB_SIZE,
      flavour="albert")
  shutil.copy(spm_model, os.path.join(al_dir, "spiece.model"))
  with open(os.path.join(al_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": True}, f)
  model = transformers.AlbertForPreTraining(transformers.AlbertConfig(
      vocab_size=VOCAB_SIZE, embedding_size=16, max_position_embeddings=128,
      hidden_act="gelu_new", attn_implementation="eager", **SIZES)).eval()
  model.save_pretrained(al_dir, safe_serialization=True)
  reference = transformers.AlbertTokenizer.from_pretrained(al_dir)
  assert len(reference) == VOCAB_SIZE
  out["albert"] = (al_dir, model, reference)
  return out


def _ours(directory):
  """The tokenizer found beside a model directory, read as its config's family reads it."""
  found = vocab_files.find_beside(directory)
  return found.load(checkpoints.read_config(directory).model_type)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vocabulary_beside_a_hf_directory_is_found_and_read_as_its_family(hf_dirs, family):
  directory, _, reference = hf_dirs[family]
  tokenizer = _ours(directory)
  assert type(tokenizer) is {"roberta": bpe.ByteLevelBPETokenizer,
                             "albert": sentencepiece_tokenizer.AlbertSentencePieceTokenizer}[family]
  assert tokenizer.do_lower_case if family == "albert" else True  # tokenizer_config.json's
  # SQuAD's inputs are the pair encoding of question and context (context words encoded one
  # at a time, as the original does, with RoBERTa's "Ġ" before every word after a space).
  context = ("Wherefore art thou Romeo? Deny thy father and refuse thy name; or, if thou wilt "
             "not, be but sworn my love, and I'll no longer be a Capulet. 1,000 naïve ducats!")
  question = "What would she no longer be?"
  data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
      {"id": "q", "question": question,
       "answers": [{"text": "a Capulet", "answer_start": context.index("a Capulet")}]}]}]}]}
  examples = squad.parse_squad_json(data, "test")
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=128,
                                             doc_stride=64, is_training=True, progress=False)
  assert len(feats.example_index) == 1
  row = feats.arrays["input_ids"][0][feats.arrays["input_mask"][0] == 1].tolist()
  assert row == reference(question, context)["input_ids"]
  start, end = feats.arrays["start_positions"][0], feats.arrays["end_positions"][0]
  assert squad.answer_text(context, feats.tokens[0], feats.context_piece[0][start],
                           feats.context_piece[0][end]) == "a Capulet"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask_from_a_hf_directory_matches_transformers(hf_dirs, family):
  directory, model, reference = hf_dirs[family]
  proc = _cli("bert_jax.predict", f"--checkpoint={directory}", *[f"--text={t}" for t in MASKED],
              "--top_k=3", "--json")
  got = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [g["text"] for g in got] == MASKED
  tokenizer = _ours(directory)
  mask = reference.mask_token
  for text, result in zip(MASKED, got):
    # RoBERTa's released tokenizer takes the space before <mask> into the mask.
    ref_text = text.replace(" [MASK]", mask).replace("[MASK]", mask)
    ids = reference(ref_text)["input_ids"]
    ours = tokenizer.build_inputs(tokenizer.encode(
        inference.mask_text(text, mask, strip_left=family == "roberta")))
    assert ours == ids
    with torch.no_grad():
      logits = model(input_ids=torch.tensor([ids])).prediction_logits if family == "albert" \
          else model(input_ids=torch.tensor([ids])).logits
    probs = torch.softmax(logits[0], -1).numpy()
    positions = [i for i, t in enumerate(ids) if t == reference.mask_token_id]
    assert len(result["predictions"]) == len(positions)
    for position, predicted in zip(positions, result["predictions"]):
      best = np.argsort(-probs[position])[:3]
      np.testing.assert_allclose([p for _, p in predicted], probs[position][best], atol=1e-5)
      shown = tokenizer.convert_ids_to_tokens(best)
      if family == "roberta":  # byte-level pieces are shown as their text
        shown = [tokenizer.piece_text(t) or t for t in shown]
      assert [t for t, _ in predicted] == shown


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILIES)
def test_glue_fine_tunes_from_a_hf_directory_and_predict_reads_the_output(hf_dirs, family,
                                                                          tmp_path):
  directory, _, _ = hf_dirs[family]
  out = str(tmp_path / "sst2")
  _cli("bert_jax.finetune", "--task_name=SST-2", f"--data_dir={_sst2_dir(tmp_path / 'data')}",
       f"--init_checkpoint={directory}", f"--output_dir={out}", "--do_train", "--do_eval",
       "--max_seq_length=32", "--train_batch_size=16", "--learning_rate=2e-3",
       "--num_train_epochs=60", "--seed=3")
  results = json.load(open(os.path.join(out, "eval_results.json")))
  assert results["dev"]["accuracy"] == 1.0, results
  # The output keeps the family's vocabulary, under the names its Hugging Face tokenizer reads.
  kept = {"roberta": ["vocab.json", "merges.txt"], "albert": ["spiece.model"]}[family]
  record = json.load(open(os.path.join(out, vocab_files.RECORD)))
  assert list(record["files"]) == kept
  for name in kept:
    assert open(os.path.join(out, name), "rb").read() == open(
        os.path.join(directory, name), "rb").read()
  assert record["flavour"] == family
  # predict finds it and reads the pairs as fine-tuning did.
  train = [line.split("\t") for line in open(os.path.join(tmp_path, "data", "dev.tsv"))][1:]
  proc = _cli("bert_jax.predict", f"--checkpoint={out}", "--json",
              *[f"--text={sentence}" for sentence, _ in train[:6]])
  labels = [json.loads(line)["label"] for line in proc.stdout.splitlines()]
  assert labels == [label.strip() for _, label in train[:6]]


@pytest.mark.slow
@pytest.mark.e2e
def test_squad_fine_tunes_from_a_roberta_directory(hf_dirs, tmp_path):
  directory, _, _ = hf_dirs["roberta"]
  out = _squad_cli(directory, tmp_path)
  predictions = json.load(open(os.path.join(out, "predictions.json")))
  questions = [qa["id"] for article in OFFICIAL["data"] for p in article["paragraphs"]
               for qa in p["qas"]]
  assert sorted(predictions) == sorted(questions)
  scores = json.load(open(os.path.join(out, "eval_results.json")))
  assert scores["eval"]["f1"] > 50.0, scores  # memorised through BPE windows and back to characters


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILIES)
def test_our_workdirs_keep_their_familys_vocabulary_for_fill_mask(plays_corpus, family, tmp_path):
  """data_prep with the family's files → a few pre-training steps → predict, no vocab flags."""
  if family == "roberta":
    vocab, _ = train_tokenizer.train_byte_level_bpe([plays_corpus], str(tmp_path / "rb"), VOCAB_SIZE)
    settings = cpd.make_settings(plays_corpus, vocab, objective="none", sequence_mode="full_sentences",
                                 masking="dynamic", max_seq_length=64, max_predictions_per_seq=10,
                                 do_lower_case=False)
    objective, preset = "mlm", "roberta_base"
  else:
    spm_model = train_tokenizer.train_sentencepiece([plays_corpus], str(tmp_path / "spiece"),
                                                    "unigram", VOCAB_SIZE, flavour="albert")
    settings = cpd.make_settings(plays_corpus, spm_model_file=spm_model, flavour="albert",
                                 objective="sop", max_seq_length=64, max_predictions_per_seq=10,
                                 dupe_factor=1)
    objective, preset = "mlm_sop", "albert_base"
  records = str(tmp_path / "records")
  cpd.create_pretraining_data(settings, output_dir=records, num_output_shards=2, num_workers=1,
                              show_progress=False)
  config = ph.run_config(os.path.join(records, "pretrain-*.tfrecord"), objective=objective, **{
      "model.vocab_size": None, "data.max_seq_length": 64, "data.max_predictions_per_seq": 10,
      "train_until_step": 2, "total_steps": 10, "checkpoint_every_steps": 1000,
      "eval_steps": 1, "log_every_steps": 1, "model.hidden_size": 32,
      "model.num_hidden_layers": 1, "model.num_attention_heads": 2,
      "model.intermediate_size": 64})
  config.model.preset = preset
  if family == "albert":
    config.model.embedding_size = 16
  workdir = str(tmp_path / "workdir")
  pretraining.train_and_evaluate(config, workdir)
  found = vocab_files.find_beside(workdir)
  assert found is not None and os.path.basename(found.main) == {
      "roberta": "vocab.json", "albert": "spiece.model"}[family]
  tokenizer = found.load(checkpoints.read_config(workdir).model_type)
  assert tokenizer.flavour == family
  if family == "albert":  # data_prep read the plays_corpus as ALBERT does, and the workdir says so
    assert json.load(open(os.path.join(workdir, vocab_files.RECORD)))["flavour"] == "albert"
  proc = _cli("bert_jax.predict", f"--checkpoint={workdir}", "--json", "--top_k=2",
              f"--text={MASKED[0]}")
  (result,) = [json.loads(line) for line in proc.stdout.splitlines()]
  config_, params = checkpoints.load_masked_lm(workdir)
  want = inference.fill_mask(config_, params, tokenizer, [MASKED[0]], top_k=2)
  np.testing.assert_allclose([p for _, p in result["predictions"][0]],
                             [p for _, p in want[0][0]], atol=1e-5)


@pytest.fixture(scope="module")
def electra_dir(plays_corpus, tmp_path_factory):
  """An ELECTRA discriminator directory (`ElectraForPreTraining`) with its generator
  (`ElectraForMaskedLM`, the embedding tables shared) in `generator/`, and BERT's uncased
  WordPiece `vocab.txt` trained on Shakespeare beside it, as Google's ELECTRA releases have."""
  torch.manual_seed(0)
  directory = str(tmp_path_factory.mktemp("hf_electra"))
  vocab = train_tokenizer.train_wordpiece([plays_corpus], str(tmp_path_factory.mktemp("el") / "wp"),
                                          vocab_size=VOCAB_SIZE)
  shutil.copy(vocab, os.path.join(directory, "vocab.txt"))
  size = sum(1 for _ in open(vocab, encoding="utf-8"))
  common = dict(vocab_size=size, embedding_size=16, max_position_embeddings=128,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                attn_implementation="eager")
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
      **common)).eval()
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=16, num_hidden_layers=2, num_attention_heads=1, intermediate_size=32,
      **common)).eval()
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  disc.save_pretrained(directory, safe_serialization=True)
  gen.save_pretrained(os.path.join(directory, "generator"), safe_serialization=True)
  return directory, gen, transformers.ElectraTokenizer(os.path.join(directory, "vocab.txt"))


@pytest.mark.slow
@pytest.mark.e2e
def test_electra_fills_masks_with_its_generator_and_fine_tunes_its_discriminator(
    electra_dir, tmp_path):
  """ELECTRA through the same commands: fill-mask reads the generator (probabilities equal
  transformers' `ElectraForMaskedLM`), GLUE (with ELECTRA's layer-wise learning-rate decay)
  and SQuAD fine-tune the discriminator."""
  directory, gen, reference = electra_dir
  proc = _cli("bert_jax.predict", f"--checkpoint={directory}", f"--text={MASKED[0]}",
              "--top_k=3", "--json")
  predicted = json.loads(proc.stdout.splitlines()[0])["predictions"][0]
  ids = reference(MASKED[0])["input_ids"]
  with torch.no_grad():
    probs = torch.softmax(gen(input_ids=torch.tensor([ids])).logits[0], -1).numpy()
  position = ids.index(reference.mask_token_id)
  best = np.argsort(-probs[position])[:3]
  np.testing.assert_allclose([p for _, p in predicted], probs[position][best], atol=1e-5)
  assert [t for t, _ in predicted] == reference.convert_ids_to_tokens(best.tolist())

  out = str(tmp_path / "sst2")
  _cli("bert_jax.finetune", "--task_name=SST-2", f"--data_dir={_sst2_dir(tmp_path / 'data')}",
       f"--init_checkpoint={directory}", f"--output_dir={out}", "--do_train", "--do_eval",
       "--max_seq_length=32", "--train_batch_size=16", "--learning_rate=2e-3",
       "--layerwise_lr_decay=0.8", "--num_train_epochs=60", "--seed=3")
  results = json.load(open(os.path.join(out, "eval_results.json")))
  assert results["dev"]["accuracy"] == 1.0, results

  out = _squad_cli(directory, tmp_path)
  scores = json.load(open(os.path.join(out, "eval_results.json")))
  assert scores["eval"]["f1"] > 50.0, scores
