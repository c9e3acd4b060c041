"""What a data preparation run reports: the statistics each shard counts (`new_shard_stats`), and
the run's summary (`summary.json` beside the records, and the lines printed at the end): what
was read and written, the masking and pairing as drawn, the packing efficiency, and warnings
about input that is probably not what was meant."""

from __future__ import annotations

import os
from typing import Any

from bert_jax.text import features as features_lib
from data_prep.instances import SEQUENCE_MODES

PAIRS = SEQUENCE_MODES[0]


def new_shard_stats() -> dict[str, Any]:
  keys = ("documents", "sentences", "lines_without_tokens", "documents_without_tokens",
          "single_sentence_documents", "sentences_longer_than_max", "document_passes",
          "short_target_passes", "instances", "tokens", "maskable_tokens", "masked",
          "masked_to_mask_token", "masked_to_random_token", "masked_kept",
          "instances_at_max_predictions", "random_next", "slots", "rows", "pieces",
          "unknown_pieces")
  return {k: 0 for k in keys}


def summarize(settings, input_files, paths, shard_stats, split_stats, skipped, seconds,
              num_workers, tokenizer) -> dict[str, Any]:
  total = new_shard_stats()
  for stats in shard_stats.values():
    for key in total:
      total[key] += stats.get(key, 0)

  def ratio(a, b):
    return round(a / b, 6) if b else None

  # Shards from before rows were counted: one row per instance.
  total["rows"] = sum(s.get("rows", s["instances"]) for s in shard_stats.values())

  summary: dict[str, Any] = {
      "input_files": len(input_files),
      "input_bytes": sum(s["bytes"] for s in split_stats) if split_stats else None,
      "input_lines_not_utf8": sum(s["bad_lines"] for s in split_stats) if split_stats else None,
      "documents": total["documents"],
      "sentences": total["sentences"],
      "single_sentence_documents": total["single_sentence_documents"],
      "documents_without_tokens_dropped": total["documents_without_tokens"],
      "lines_without_tokens_dropped": total["lines_without_tokens"],
      "sentences_longer_than_max": total["sentences_longer_than_max"],
      "instances": total["instances"],
      "tokens": total["tokens"],
      # What next_sentence_labels mean: nsp (1 = B is random), sop (1 = A and B swapped) or
      # none (always 0); and how many are 1.
      "sentence_objective": settings.get("objective", "nsp"),
      "sequence_mode": settings.get("sequence_mode", PAIRS),
      "masking_strategy": settings.get("masking_strategy") or (
          "whole_word" if settings["do_whole_word_mask"] else "token"),
      "random_next_fraction": (ratio(total["random_next"], total["instances"])
                               if settings.get("objective", "nsp") == "nsp" else None),
      "swapped_fraction": (ratio(total["random_next"], total["instances"])
                           if settings.get("objective") == "sop" else None),
      "short_target_fraction": ratio(total["short_target_passes"], total["document_passes"]),
      "padding_fraction": ratio(total["slots"] - total["tokens"], total["slots"]),
      # Real tokens / row tokens, packed or not (unpacked: 1 - padding_fraction), so the two
      # compare; and instances per row (1 unpacked).
      "packing_efficiency": ratio(total["tokens"], total["slots"]),
      "sequences_per_row": ratio(total["instances"], total["rows"]),
      "rows": total["rows"],
      "mean_tokens_per_instance": ratio(total["tokens"], total["instances"]),
      "unknown_piece_fraction": ratio(total["unknown_pieces"], total["pieces"]),
  }
  if settings["masking"] == features_lib.STATIC:
    summary.update({
        "masked_fraction": ratio(total["masked"], total["maskable_tokens"]),
        "masked_per_instance": ratio(total["masked"], total["instances"]),
        "instances_at_max_predictions": ratio(total["instances_at_max_predictions"],
                                              total["instances"]),
        "mask_token_fraction": ratio(total["masked_to_mask_token"], total["masked"]),
        "random_token_fraction": ratio(total["masked_to_random_token"], total["masked"]),
        "kept_token_fraction": ratio(total["masked_kept"], total["masked"]),
    })
  warnings = []
  if total["documents"] and total["single_sentence_documents"] > 0.5 * total["documents"]:
    warnings.append(f"{total['single_sentence_documents']:,} of {total['documents']:,} documents "
                    "have one sentence: is the input one sentence per line with a blank line "
                    "between documents? NSP needs sentences to pair.")
  few = sorted(i for i, s in shard_stats.items() if s["documents"] < 2)
  if few and settings.get("objective", "nsp") == "nsp":
    warnings.append(f"shard(s) {few[:10]} hold fewer than 2 documents, so 'random next' "
                    "segments come from the same document: use fewer --num_output_shards.")
  if total["sentences"] and total["sentences_longer_than_max"] > 0.05 * total["sentences"]:
    warnings.append(f"{total['sentences_longer_than_max']:,} sentences are longer than "
                    f"max_seq_length - 3 = {settings['max_seq_length'] - 3} tokens and get cut: "
                    "are lines sentences, or whole paragraphs?")
  summary.update({
      "seconds": round(seconds, 2),
      "instances_per_second": round(total["instances"] / seconds, 1) if seconds else None,
      "num_workers": num_workers,
      "shards": len(paths),
      "shards_skipped_as_complete": skipped,
      "vocab_size": tokenizer.vocab_size,
      "output_files": paths,
      # Per shard file (by name): what the input pipeline checks each file against.
      "records_per_file": {os.path.basename(paths[i]): stats.get("records", stats["instances"])
                           for i, stats in sorted(shard_stats.items())},
      "bytes_per_file": {os.path.basename(paths[i]): stats["bytes"]
                         for i, stats in sorted(shard_stats.items()) if "bytes" in stats},
      "settings": settings,
      "warnings": warnings,
  })
  return summary


def print_summary(summary: dict[str, Any], summary_path: str) -> None:
  lines = [f"Wrote {summary['instances']:,} instances to {summary['shards']} shard(s) "
           f"in {summary['seconds']:,.1f} s ({summary['instances_per_second'] or 0:,.0f} "
           "instances/s)."]
  for key in ("documents", "sentences", "tokens", "masked_fraction", "random_next_fraction",
              "swapped_fraction",
              "short_target_fraction", "padding_fraction", "packing_efficiency",
              "sequences_per_row"):
    if summary.get(key) is not None:
      value = summary[key]
      lines.append(f"  {key:24s} {value:,.4f}" if isinstance(value, float) else
                   f"  {key:24s} {value:,}")
  for warning in summary["warnings"]:
    lines.append(f"  warning: {warning}")
  lines.append(f"Summary: {summary_path}")
  print("\n".join(lines), flush=True)
