"""Translate a whole split and score it: sacreBLEU and chrF on detokenized text, and the paper's
tokenized BLEU beside them.

    result = evaluate(Translator("runs/default", beam_size=4), data, "test", num_examples=10)
    floor = copy_baseline(data.raw_examples("test"), "test", "runs/default/baselines", 10,
                          lang="de")

BLEU is sacreBLEU's default (cased, 13a tokenizer, exp smoothing) against the raw references;
the signatures are in the result. The copy baseline scores what needs no model at all: names,
numbers, file names and other tokens that a translation keeps unchanged.

Outputs go to `<workdir>/eval/<checkpoint>/` (`step_1000`, `averaged_last5_1000`; an ensemble's
to `<checkpoint>.ensemble<M>_<digest>`, `translator_output_dir`), never into a
checkpoint's step directory: training deletes old steps (keep-N) and would take an evaluation
with them, or an evaluation still running when its step went would write a stray step
directory back. Their names carry the split and the search (`test.greedy`,
`test.beam4.alpha0.6`), so evaluations of one checkpoint with different searches sit side by
side, and every result is also appended to `<workdir>/eval/results.jsonl`.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from typing import Sequence

import ml_collections

from transformer_jax import bleu as bleu_lib
from transformer_jax.data import fingerprint  # hashes a text corpus; loads no TFDS
from transformer_jax.data.config import OWN_SPLIT_DATASETS, default_data_config
from transformer_jax.files import write_atomically
from transformer_jax.inference.flags import read_flag_lines
from transformer_jax.inference.translator import Translator, warn_stderr
from transformer_jax.run.metrics import append_line
from transformer_jax.run.workdir import (
  CHECKPOINTS,
  CONFIG,
  EVAL,
  EVAL_LOG,
  RESOLVED_DATA,
  RunError,
  corpus_changes,
  load_run_config,
)

BASELINES = ("copy",)
SPLITS = ("validation", "test")  # the held-out splits of a run's data that can be scored


def nonempty(pairs: list[tuple[str, str]], split: str) -> list[tuple[str, str]]:
  if not pairs:
    raise RunError(f"the {split} split is empty")
  return pairs


def scores(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> dict:
  """sacreBLEU and chrF of detokenized hypotheses, and the paper's tokenized BLEU (Moses
  tokenizer for the target language `lang`, compounds split), each with its signature; and
  `bleu_ci95`, the half-width of sacreBLEU's 95% bootstrap interval (1,000 resamples of the
  sentences): BLEU 32.1 with `bleu_ci95` 0.9 reads 32.1 +- 0.9."""
  bleu, bleu_signature = bleu_lib.corpus_bleu(hypotheses, references)
  interval, interval_signature = bleu_lib.bleu_interval(hypotheses, references)
  chrf, chrf_signature = bleu_lib.corpus_chrf(hypotheses, references)
  tokenized, tokenized_signature = bleu_lib.tokenized_bleu(hypotheses, references, lang)
  return {"bleu": bleu, "bleu_ci95": interval, "chrf": chrf, "tokenized_bleu": tokenized,
          "bleu_signature": bleu_signature, "bleu_ci95_signature": interval_signature,
          "chrf_signature": chrf_signature, "tokenized_bleu_signature": tokenized_signature}


def target_lang(run: dict) -> str:
  """The run's target language (`config.data.target_lang`), for the Moses tokenizer."""
  return str(run.get("data", {}).get("target_lang") or "de")


def examples(pairs: Sequence[tuple[str, str]], hypotheses: Sequence[str], num: int,
             worst: int = 1, seed: int = 0) -> list[dict]:
  """`num` pairs drawn at random (`seed`), in the split's order, then the `worst` others with
  the lowest sentence chrF: what a results page shows, reproducible from the hypotheses."""
  chrf = [bleu_lib.sentence_chrf(h, t) for (_, t), h in zip(pairs, hypotheses)]
  drawn = sorted(random.Random(seed).sample(range(len(pairs)), min(num, len(pairs))))
  rest = sorted(set(range(len(pairs))) - set(drawn), key=lambda i: (chrf[i], i))
  return [{"pair": i + 1, "source": pairs[i][0], "reference": pairs[i][1],
           "hypothesis": hypotheses[i], "chrf": chrf[i], "worst": n >= len(drawn)}
          for n, i in enumerate(drawn + rest[:worst])]


def examples_markdown(rows: list[dict]) -> str:
  """A Markdown table of `examples`, with a column for comments."""
  def cell(text: str) -> str:
    return text.replace("|", "\\|") or " "  # a | inside a cell would end it
  lines = ["| pair | source | reference | ours | sentence chrF | comment |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['pair']}{' (worst)' if r['worst'] else ''} | {cell(r['source'])} | "
            f"{cell(r['reference'])} | {cell(r['hypothesis'])} | {r['chrf']:.0f} | |"
            for r in rows]
  return "\n".join(lines) + "\n"


def search_name(translator: Translator) -> str:
  """`greedy` or `beam 4, alpha 0.6`: the search, as the command's lines name it."""
  if translator.beam_size == 1:
    return "greedy"
  return f"beam {translator.beam_size}, alpha {translator.alpha:g}"


def bleu_text(result: dict) -> str:
  """`BLEU 32.12 +- 3.58` (the 95% bootstrap interval), or `BLEU 32.12` where it was not
  computed (too many sentences, or a result from before it existed)."""
  ci = result.get("bleu_ci95")
  return f"BLEU {result['bleu']:.2f}" + ("" if ci is None else f" +- {ci:.2f}")


def grid_p_values(results: Sequence[dict], references: Sequence[str]) -> list[float | None]:
  """Paired bootstrap p-values of every search in a grid against the first best one (the first
  row with the top sacreBLEU, None there), from their hypotheses files."""
  top = max(range(len(results)), key=lambda i: (results[i]["bleu"], -i))
  order = [top] + [i for i in range(len(results)) if i != top]
  p = bleu_lib.paired_bootstrap([bleu_lib.read_lines(results[i]["hypotheses"]) for i in order],
                                list(references))
  out: list[float | None] = [None] * len(results)
  for i, value in zip(order, p):
    out[i] = value
  return out


def grid_table(split: str, results: Sequence[dict],
               p_values: Sequence[float | None] | None = None) -> str:
  """evaluate.py's closing table for several searches (`--beam_size 1,4 --alpha 0.6,1.0`): one
  row each, in the order searched, the best BLEU marked, every row that has it (the paper chose
  beam and alpha on the development set); with `p_values` (`grid_p_values`), a column of each
  search's paired bootstrap p-value against the first best one. Results of several
  checkpoints (`--step 2000,2500`) get a step column, and the choice names the step."""
  top = max(r["bleu"] for r in results)
  same = all(r["bleu"] == top for r in results)
  show_p = p_values is not None and not same and any(p is not None for p in p_values)
  steps = len({r.get("step") for r in results}) > 1
  rows = [f"evaluate: {split}: {len(results)} " + ("evaluations " if steps else "searches ")
          + ("(all the same sacreBLEU)" if same else "(the best sacreBLEU marked *)"),
          "  " + (f"{'step':>7}  " if steps else "") + f"{'beam':>4}  {'alpha':>5}  "
          f"{'BLEU':>6}  {'+-95%':>5}  {'chrF':>6}  {'tokenized BLEU':>14}  {'sentences/s':>11}"
          + ("  p vs best" if show_p else "")]
  for i, r in enumerate(results):
    alpha = "-" if r["alpha"] is None else f"{r['alpha']:g}"
    best = r["bleu"] == top and not same
    ci = f"{r['bleu_ci95']:>5.2f}" if r.get("bleu_ci95") is not None else f"{'':>5}"
    p = ""
    if show_p:
      p = "  " + ("-" if p_values[i] is None else f"{p_values[i]:.3f}").rjust(9)
    step = f"{r.get('step')!s:>7}  " if steps else ""
    # None where nothing was searched (every source blank).
    speed = "-" if r["sentences_per_sec"] is None else f"{r['sentences_per_sec']:.1f}"
    rows.append(f"{'*' if best else ' '} {step}{r['beam_size']:>4}  {alpha:>5}  {r['bleu']:>6.2f}  "
                f"{ci}  {r['chrf']:>6.2f}  {r['tokenized_bleu']:>14.2f}  {speed:>11}{p}")
  if show_p:
    rows.append(f"p vs best: paired bootstrap ({bleu_lib.BOOTSTRAP_SAMPLES:,} resamples, "
                "sacreBLEU's --paired-bs) against the row marked - ; above 0.05 the "
                "difference is within what the choice of sentences moves")
  winners = [r for r in results if r["bleu"] == top]
  if split == "validation" and len(winners) == 1:
    w = winners[0]
    search = (f"--beam_size {w['beam_size']}" if w["alpha"] is None
              else f"--beam_size {w['beam_size']} --alpha {w['alpha']:g}")
    if steps:
      search = f"--step {w['step']} {search}"
    rows.append(f"chosen on the development set: score the test split with {search} "
                "--split test")
  return "\n".join(rows)


def search_tag(beam_size: int, alpha: float, max_len_margin: int) -> str:
  """`greedy` or `beam4.alpha0.6`, plus `.margin20` when the margin is not the paper's 50."""
  # 6 significant digits, unless two alphas would then share a tag (and a file): all of them.
  shown = f"{alpha:g}" if float(f"{alpha:g}") == alpha else repr(alpha)
  tag = "greedy" if beam_size == 1 else f"beam{beam_size}.alpha{shown}"
  return tag if max_len_margin == 50 else f"{tag}.margin{max_len_margin}"


def default_output_dir(workdir: str, checkpoint_dir: str, step: int,
                       averaged: int | None = None) -> str:
  """`<workdir>/eval/step_<N>` for the run's own checkpoints, `averaged_last<k>_<N>` or
  `best_bleu_<N>` for its `averaged/` or `best_bleu/`, and `<parent>.<name>_<N>` (path-safe)
  for another directory's. `averaged`: how many checkpoints the parameters average (None: not
  an average); it is in the name because averages of different counts share their last step,
  and so `averaged/<N>`, but their evaluations must not replace each other's files."""
  workdir = os.path.abspath(workdir)
  checkpoint_dir = os.path.abspath(checkpoint_dir)
  if checkpoint_dir == os.path.join(workdir, CHECKPOINTS):
    name = "step"
  elif os.path.dirname(checkpoint_dir) == workdir:
    name = os.path.basename(checkpoint_dir)
  else:
    # Named by its last two directories and a digest of its whole path: two runs' `run/`
    # directories (a/run, b/run) must not write into one directory.
    parent, base = os.path.split(checkpoint_dir)
    digest = hashlib.sha256(checkpoint_dir.encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{os.path.basename(parent)}.{base}") + f"-{digest}"
  if averaged is not None:
    name = f"{name}_last{averaged}"
  return os.path.join(workdir, EVAL, f"{name}_{step}")


def translator_output_dir(translator: Translator) -> str:
  """`default_output_dir` of the translator's checkpoint; for an ensemble, with
  `.ensemble<M>_<digest>` after it (M models in all, the digest of the other members'
  checkpoints, in any order), so that an ensemble's files never replace its first member's alone."""
  averaged = translator.averaged_steps
  path = default_output_dir(translator.workdir, translator.checkpoint_dir, translator.step,
                            len(averaged) if averaged is not None else None)
  if not translator.members:
    return path
  # Sorted: the same members in another order are the same ensemble (the mean is symmetric).
  names = json.dumps(sorted(os.path.abspath(m["checkpoint"]) for m in translator.members))
  digest = hashlib.sha256(names.encode()).hexdigest()[:8]
  return f"{path}.ensemble{len(translator.members) + 1}_{digest}"


def writable_dir(path: str) -> None:
  """Create `path` if needed; a RunError naming it when it cannot be written."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise RunError(f"cannot create the output directory {path}: {e.strerror or e}; pass "
                   "--output_dir DIR with a directory you can write") from None
  if not os.access(path, os.W_OK):
    raise RunError(f"the output directory {path} is not writable; pass --output_dir DIR with a "
                   "directory you can write")


def warn_if_other_files(path: str, result: dict, kept: str = " (eval/results.jsonl keeps "
                        "both)") -> None:
  """A test set of one's own is named after one of its files: the same source scored against
  other references (or another source of the same name; score.py: other targets of the same
  file name) replaces the earlier files, which is said. `kept`: where the earlier result
  survives, if anywhere."""
  try:
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  except (OSError, ValueError):
    return
  for key in ("source_file", "reference_file", "target_file"):
    if isinstance(old, dict) and old.get(key) and old.get(key) != result.get(key):
      warn_stderr(f"{path} held the result for {key} {old[key]}; it is replaced by this one "
                  f"for {result.get(key)}{kept}: pass --name to keep their files side by side")
      return


def _warn_if_other_references(path: str, references: str, result: dict) -> None:
  """`references.<split>.txt` is shared by every search of the split in its directory: other
  references written over it (a test set of one's own of the same name, scored against
  another reference file) leave the earlier searches' results pointing at references they
  were not scored on, which is said."""
  try:
    with open(path, encoding="utf-8") as f:
      if f.read() == references:
        return
  except (OSError, ValueError):  # none yet, or unreadable: nothing of it to keep
    return
  given = result.get("reference_file") or result.get("target_file")
  warn_stderr(f"{path} held other references, which the earlier results in its directory "
              f"were scored on; it is replaced by {f'those of {given}' if given else 'these'}, "
              "and those results' BLEU no longer follows from the files beside them: pass "
              "--name to keep test sets scored against different references side by side")


def _write(output_dir: str, split: str, tag: str, hypotheses: Sequence[str], result: dict,
           pairs: Sequence[tuple[str, str]], num_examples: int, workdir: str | None) -> dict:
  """`hypotheses.<name>.txt` (one line per pair, in the split's order), `eval.<name>.json` and
  `examples.<name>.md` (`num_examples` drawn at random with seed 0, plus the worst), `name`
  being `<split>.<tag>`, and `references.<split>.txt`, the references scored, line by line
  beside the hypotheses: sacreBLEU's own command compares any two evaluations with them
  (`sacrebleu references.test.txt -i A B --paired-bs`, docs/decoding.md). The result is also
  appended as one line to `<workdir>/eval/results.jsonl` (unless `workdir` is None), with
  `time` (Unix seconds, as in metrics.jsonl): two evaluations of the same settings differ."""
  name = f"{split}.{tag}"
  os.makedirs(output_dir, exist_ok=True)
  warn_if_other_files(os.path.join(output_dir, f"eval.{name}.json"), result)
  result["time"] = time.time()
  result["hypotheses"] = os.path.join(output_dir, f"hypotheses.{name}.txt")
  write_atomically(result["hypotheses"], "".join(h + "\n" for h in hypotheses))
  result["references"] = os.path.join(output_dir, f"references.{split}.txt")
  references = "".join(" ".join(r.splitlines()) + "\n" for _, r in pairs)
  _warn_if_other_references(result["references"], references, result)
  write_atomically(result["references"], references)
  if num_examples > 0:
    result["examples"] = os.path.join(output_dir, f"examples.{name}.md")
    write_atomically(result["examples"],
                     examples_markdown(examples(pairs, hypotheses, num_examples)))
  write_atomically(os.path.join(output_dir, f"eval.{name}.json"), json.dumps(result, indent=2))
  if workdir is not None:
    os.makedirs(os.path.join(workdir, EVAL), exist_ok=True)
    # One write of one line in append mode (evaluations running side by side do not
    # interleave), on a line of its own after one cut short.
    append_line(os.path.join(workdir, EVAL, EVAL_LOG), json.dumps(result))
  return result


def file_pairs(source: str, reference: str, target_flag: str = "reference"
               ) -> list[tuple[str, str]]:
  """(source, reference) pairs of two line-aligned UTF-8 files, every line kept (a test set
  is scored whole); files of different lengths are an error naming both. `target_flag`: the
  flag that named `reference` (score.py's is --target), for the errors."""
  sources = read_flag_lines("source", source)
  references = read_flag_lines(target_flag, reference)
  if len(sources) != len(references):
    raise RunError(f"--source {source} has {len(sources):,} lines but --{target_flag} "
                   f"{reference} has {len(references):,}: they must be line-aligned")
  for flag, path, lines in (("source", source, sources), (target_flag, reference, references)):
    filled = [line for line in lines if line.strip()]
    if filled and all("\t" in line for line in filled):
      # A corpus's TSV (source<TAB>target) given as a test set: every "sentence" would hold
      # both sides.
      raise RunError(f"every line of --{flag} {path} holds a tab: a TSV of pairs? --source and "
                     f"--{target_flag} take one sentence per line, in two files: split it, e.g. "
                     f"`cut -f1 {path} > source.txt` and `cut -f2 {path} > {target_flag}.txt`")
  return list(zip(sources, references))


def own_test_set(source: str | None, reference: str | None, name: str | None = None,
                 target_flag: str = "reference", named_by: str = "--name"
                 ) -> tuple[str, list[tuple[str, str]], dict, tuple[str, str]] | None:
  """(name, pairs, extra, origin) of the test set of one's own in `source`/`reference` (None
  without `source`: a split of the run's data is scored): its `name` (default: the source
  file's name without its extension), its pairs (`file_pairs`), the result fields saying where
  it came from, and the flags that name its empty lines (`check_empty`). `target_flag`: the
  flag that named `reference` (score.py's is --target), in the errors, the result field
  `<target_flag>_file` and the origin; `named_by`: where a `name` given (not None) came from,
  for the errors (score.py's default is its --target's file name)."""
  if not source:
    return None
  given = f"the test set's name {name!r} ({named_by})" if name else None
  name = name or os.path.splitext(os.path.basename(source))[0]
  given = given or f"the test set's name {name!r} (the source file's name)"
  # The name goes into file names beside the splits' own files.
  if name in SPLITS:
    raise RunError(f"{given} is a split's: its files would replace the split's own in the "
                   "same directory: pass another with --name")
  if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
    raise RunError(f"{given} must be letters, digits, '_', '.' or '-': pass another with "
                   "--name")
  pairs = file_pairs(source, reference, target_flag)
  if not pairs:  # said before a model is loaded, naming the files, not a "split"
    raise RunError(f"--source {source} and --{target_flag} {reference} are empty: nothing to "
                   "score. Give the sources and their targets, one sentence a line, "
                   "line-aligned")
  return (name, pairs,
          {"source_file": os.path.abspath(source),
           f"{target_flag}_file": os.path.abspath(reference)},
          (f"--source {source}", f"--{target_flag} {reference}"))


def _corpus_config(run: dict, data_dir: str | None):
  """(`run`'s data config, how its corpus files differ from those it recorded)."""
  config = ml_collections.ConfigDict(run["data"])
  if data_dir:
    config.data_dir = data_dir
  recorded = run.get(RESOLVED_DATA, {})
  # A relative corpus path names the file of the directory training ran in: where this one has
  # none, the run's own file (recorded with its absolute path) is read.
  for field, path in fingerprint.recorded_roles(recorded, run["data"]).items():
    given = config[field]
    if given and not os.path.isabs(given) and not os.path.exists(given) and os.path.exists(path):
      config[field] = path
  return config, corpus_changes(run, config)


def data_config(run: dict, workdir: str, data_dir: str | None = None) -> ml_collections.ConfigDict:
  """The `data` config of the run `run` (its config.json, in `workdir`), to rebuild its splits;
  `data_dir`: where TFDS finds them instead."""
  if "split" not in run["data"]:
    # Recorded since 2026-11-23 13:31; the held-out pairs of a locale or text corpus depend on
    # it, so it is not guessed.
    if run["data"].get("dataset") not in OWN_SPLIT_DATASETS:
      raise RunError(
          f"{os.path.join(workdir, 'config.json')} has no data.split (the run predates "
          "its recording): add \"split\": \"grouped\" to its \"data\" section for a run "
          "made after 2026-11-23 11:55 (near-duplicates grouped), else \"split\": \"source\"")
    # Numbers and WMT runs never read it: any valid value builds the same splits.
    run = {**run, "data": {**run["data"], "split": default_data_config().split}}
  config, changes = _corpus_config(run, data_dir)
  if changes and os.path.exists(os.path.join(workdir, CONFIG)):
    # `run` is the config of an older step; a later resume may have recorded the corpus moved
    # (the same bytes in the same roles, or that resume was refused): its paths are the
    # corpus's now.
    latest = load_run_config(workdir)
    if latest.get(RESOLVED_DATA) != run.get(RESOLVED_DATA):
      moved, still = _corpus_config(latest, data_dir)
      if not still:
        return moved
  if changes:
    relative = any(config[f] and not os.path.isabs(config[f]) for f in fingerprint.roles(config))
    raise RunError(
        f"{workdir}'s corpus files differ from those it was trained on:\n  "
        + "\n  ".join(changes) + "\nIts validation and test splits would be built again from "
        "these files, with other sentences than the run held out (and scores that do not "
        "compare with its own). Restore the files to evaluate on the run's splits, or evaluate "
        "on a test set of your own with --source and --reference."
        + (f" Relative corpus paths were read from {os.getcwd()}: run from the directory the "
           "run was trained in." if relative else ""))
  return config


def empty_pairs(pairs: Sequence[tuple[str, str]]) -> tuple[list[int], list[int]]:
  """The numbers (from 1) of the pairs whose source, and whose reference, is empty or blank."""
  return ([i + 1 for i, (s, _) in enumerate(pairs) if not s.strip()],
          [i + 1 for i, (_, t) in enumerate(pairs) if not t.strip()])


def _numbers(numbers: list[int], unit: str, shown: int = 5) -> str:
  """`2 (lines 3, 9)`, `0`, `7 (lines 1, 2, 3, 4, 5, ...)`."""
  if not numbers:
    return "0"
  more = ", ..." if len(numbers) > shown else ""
  plural = "s" if len(numbers) > 1 else ""
  return f"{len(numbers)} ({unit}{plural} {', '.join(map(str, numbers[:shown]))}{more})"


def check_empty(pairs: Sequence[tuple[str, str]], split: str,
                origin: tuple[str, str] | None = None, warn=warn_stderr) -> dict:
  """Warn (one line) of empty sources and references, which would score silently: sacreBLEU's
  chrF leaves out a pair with an empty reference (its hypothesis counts for nothing, right or
  wrong), and an empty source gets an empty hypothesis. A blank line can be legitimate, so it
  is not refused. `origin`: the flags and files of a test set of one's own, numbered by line (a
  split's pairs are numbered as pairs). Returns the counts, for the result."""
  sources, references = empty_pairs(pairs)
  if sources or references:
    names = origin or (f"the {split} sources", f"the {split} references")
    unit = "line" if origin else "pair"
    warn(f"empty {unit}s: {names[1]}: {_numbers(references, unit)}; {names[0]}: "
         f"{_numbers(sources, unit)}; sacreBLEU's chrF leaves out pairs with an empty reference "
         "and an empty source is not translated (empty_references and empty_sources in the "
         "result)")
  return {"empty_sources": len(sources), "empty_references": len(references)}


# What the Moses tokenizer and the compound split leave in text: its escapes, tensor2tensor's
# `##AT##`, the `-a` option's `@-@`; and periods and commas split off as words, which raw text
# has seldom (French's `« , »`), so those count only when a tenth of the lines have them.
_TOKENIZED = re.compile(r"##AT##|@-@|&(?:quot|apos|amp|lt|gt|#124|#91|#93);")
_SPLIT_OFF = re.compile(r"\s[.,](?:\s|$)")


def tokenized_lines(references: Sequence[str]) -> list[int]:
  """The numbers (from 1) of the references that look Moses-tokenized: holding its escapes,
  `##AT##` or `@-@`, or, when a tenth of them or more do, a period or comma standing alone."""
  marked = {i for i, t in enumerate(references) if _TOKENIZED.search(t)}
  split_off = {i for i, t in enumerate(references) if _SPLIT_OFF.search(t)}
  if len(split_off) >= max(2, len(references) / 10):
    marked |= split_off
  return [i + 1 for i in sorted(marked)]


def check_tokenized(pairs: Sequence[tuple[str, str]], split: str,
                    origin: tuple[str, str] | None = None, warn=warn_stderr) -> dict:
  """Warn (one line) of references that look Moses-tokenized already (`newstest2014.tok.de`,
  Stanford's compound-split copies): both BLEU figures expect raw text, and `tokenized_bleu`
  tokenizes again what was tokenized (`&quot;` -> `&amp; quot ;`), without an error. Returns
  the count, for the result."""
  lines = tokenized_lines([t for _, t in pairs])
  if lines:
    name = origin[1] if origin else f"the {split} references"
    unit = "line" if origin else "pair"
    warn(f"{name}: {_numbers(lines, unit)} of {len(pairs):,} look tokenized already (Moses "
         "escapes such as &quot;, ##AT##, @-@, or periods and commas split off as words): "
         "sacreBLEU and tokenized_bleu both expect raw, detokenized references and would score "
         "them wrongly; pass the raw text (for WMT, the test set's .sgm or plain-text release, "
         "not a .tok file)")
  return {"tokenized_looking_references": len(lines)}


def check_training_overlap(run: dict, workdir: str, pairs: Sequence[tuple[str, str]],
                           origin: tuple[str, str], data_dir: str | None = None,
                           warn=warn_stderr, measure: str = "BLEU",
                           target: str = "reference") -> dict:
  """Warn (one line) of the pairs of a test set of one's own whose source or `target` (the
  reference; score.py's target) is, up to case and punctuation (`leakage.normalize`), one of the
  run's training pairs': the `measure` on them (BLEU; score.py's perplexity) says what the model
  remembers. The run's splits are held out by the same measure (data/leakage.py); a test set
  from elsewhere is not. Reads every training pair of the run's dataset where it is built
  (`data_dir`: where TFDS finds it instead of the run's data.data_dir); says why not where it
  cannot. Returns `train_overlap` for the result: `leakage.overlap`'s counts, or None where not
  checked."""
  from transformer_jax.data import datasets, iter_pairs, leakage
  try:
    config = data_config(run, workdir, data_dir)
    builder = datasets.make_builder(config)
    built = builder.is_prepared()
  except (RunError, ValueError, OSError) as e:  # the corpus changed or is gone: said, not fatal
    built, why = False, str(e).splitlines()[0]
  else:
    why = (f"the run's dataset is not built in {builder.data_dir_root} (pass --data_dir where "
           "it is, or build it: python scripts/prepare_data.py --config <the run's config>)")
  if not built:
    warn(f"{origin[0]}: not compared with the run's training pairs: {why}")
    return {"train_overlap": None}
  keys = leakage.train_keys(iter_pairs(builder.as_data_source(split="train"), config))
  counts, found = leakage.overlap(keys, pairs)
  if found:
    warn(f"{origin[0]}: {_numbers(found, 'line')} of {len(pairs):,} pairs have a source or "
         f"{target} that the run trained on ({counts['exact_source']} sources and "
         f"{counts['verbatim_target']} {target}s verbatim, the rest up to case and "
         f"punctuation): their {measure} measures what the model remembers (train_overlap in "
         "the result)")
  return {"train_overlap": counts}


def check_pairs(pairs: Sequence[tuple[str, str]], split: str,
                origin: tuple[str, str] | None = None, warn=warn_stderr) -> dict:
  """`check_empty` and `check_tokenized`: the counts for the result, each warned about once."""
  return {**check_empty(pairs, split, origin, warn), **check_tokenized(pairs, split, origin, warn)}


def evaluate(translator: Translator, data, split: str, output_dir: str | None = None, *,
             num_examples: int, pairs: list[tuple[str, str]] | None = None,
             extra: dict | None = None, origin: tuple[str, str] | None = None,
             quiet: bool = False) -> dict:
  """Translate every pair of `split` (nothing dropped or truncated for length), write the
  hypotheses, examples and the result into `output_dir` (default: `default_output_dir`) as
  `<kind>.<split>.<search tag>.*` and the references as `references.<split>.txt`, append the
  result to `<workdir>/eval/results.jsonl` and return the scores, the search settings and the
  search throughput. With `pairs` (a test set
  of one's own, `file_pairs`), those are scored instead, under the name `split`; `extra`
  fields go into the result (where those came from), and `origin` names them in the warning
  about empty lines (`check_empty`). `quiet`: counted in the result, the data's warnings
  (empty, tokenized-looking and long lines) are not said again (the searches of a grid after
  the first)."""
  pairs = nonempty(data.raw_examples(split) if pairs is None else pairs, split)
  warn = (lambda message: None) if quiet else warn_stderr
  empty = check_pairs(pairs, split, origin, warn)
  output_dir = output_dir or translator_output_dir(translator)
  writable_dir(output_dir)  # now, not after the whole search
  warnings: list[str] = []
  hypotheses = translator.translate([s for s, _ in pairs], warnings.append,
                                    names=[f"{split} pair {i + 1}" for i in range(len(pairs))])
  shown = 10  # long sources named one by one; the rest are counted in one line
  for w in warnings[:shown]:
    warn(w)
  more = len(warnings) - shown
  if more > 0:
    warn(f"... and {more} more source{'s' if more > 1 else ''} longer than max_len - 1 pieces")
  hypotheses = [" ".join(h.splitlines()) for h in hypotheses]  # one line per pair, always
  # Every warning is one source over max_len - 1 pieces: cut when truncating, else read whole.
  result = {"split": split, "sentences": len(pairs),
            **scores(hypotheses, [t for _, t in pairs], target_lang(translator.run)),
            **translator.settings(),
            "long_sources": len(warnings),
            "truncated_sources": len(warnings) if translator.truncate else 0, **empty,
            **translator.stats.as_dict(), **(extra or {})}
  tag = search_tag(translator.beam_size, translator.alpha, translator.max_len_margin)
  return _write(output_dir, split, tag, hypotheses, result, pairs, num_examples,
                translator.workdir)


def copy_baseline(pairs: list[tuple[str, str]], split: str, output_dir: str,
                  num_examples: int, workdir: str | None = None, extra: dict | None = None,
                  origin: tuple[str, str] | None = None, *, lang: str) -> dict:
  """The scores of copying each source of `pairs` (the split's) as its translation: no model
  and no tokenizer involved. With `workdir`, the result is also appended to its
  `eval/results.jsonl`; `extra` and `origin` as for `evaluate`; `lang` is the target language
  (`target_lang`), for the tokenized BLEU."""
  pairs = nonempty(pairs, split)
  empty = check_pairs(pairs, split, origin)
  writable_dir(output_dir)  # one error line naming the flag, not a bare OSError from _write
  hypotheses = [" ".join(s.split()) for s, _ in pairs]
  result = {"split": split, "sentences": len(pairs), "baseline": "copy",
            **scores(hypotheses, [t for _, t in pairs], lang), **empty, **(extra or {})}
  return _write(output_dir, split, "copy", hypotheses, result, pairs, num_examples, workdir)
