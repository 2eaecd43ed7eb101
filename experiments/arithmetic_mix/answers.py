"""Arithmetic answers: how each is scored and bucketed, and the test split.

The arithmetic reports (`digits_report`, `llm_report`) score a run's stored
predictions against its test problems (questions and answers are not in the
records), read from the prepared data or from the copy a report keeps
beside its results (`read_test_problems`).
"""

import collections
import glob
import json
import os
import pathlib
import re
import sys

import numpy as np

from experiments import common
from train.tasks import arithmetic_mix as task

_NUMBER = r"-?\d+(?:\.\d+)?"
_EXPRESSION = re.compile(rf"({_NUMBER})\s*([+-])\s*({_NUMBER})")
_ADD_WORDS = re.compile(r"\b(plus|add|sum|total|put together)\b")
_SUBTRACT_WORDS = re.compile(
    r"\b(minus|subtract|take away|less than|difference|distance)\b"
)


def answer_digits(answer: str) -> int:
  """How many digits the answer has (sign and decimal point not counted).

  ``'-153.97'`` has 5, ``'0.09'`` 3 (the leading zero is written too).
  """
  return sum(c.isdigit() for c in answer.strip())


def digit_range(problems) -> dict:
  """The answers' digits: dict(median, low, high)."""
  digits = [answer_digits(a) for _, a in problems]
  return dict(median=np.median(digits), low=min(digits), high=max(digits))


DIGIT_BUCKETS = ("<=3", "4", "5", "6", "7", "8", ">=9")


def digits_bucket(answer: str) -> str:
  """The answer-length column of an answer: ``'<=3'``, ``'4'``..``'8'``,
  ``'>=9'``."""
  return DIGIT_BUCKETS[min(max(answer_digits(answer), 3), 9) - 3]


def operation(question: str) -> str | None:
  """``'add'`` or ``'subtract'``: the operation as the question writes it.

  Worded questions by their verb ('Add', 'Sum', 'Total of', 'Put together',
  'plus'; 'Subtract', 'minus', 'take away', 'less than', 'difference',
  'distance'), bare ones by their operator (``'-20.3+-1891'`` adds,
  ``'44 - -46.6'`` subtracts, whatever the operands' signs). None if neither
  reading applies.
  """
  text = question.lower()
  add = bool(_ADD_WORDS.search(text))
  subtract = bool(_SUBTRACT_WORDS.search(text))
  if add or subtract:  # both kinds of word: ambiguous
    return None if add and subtract else "add" if add else "subtract"
  match = _EXPRESSION.search(question)
  return match and ("add" if match.group(2) == "+" else "subtract")


def has_decimals(answer: str) -> bool:
  """Whether the answer is written with a decimal point."""
  return "." in answer


def decimals_bucket(answer: str) -> str:
  return "decimal" if has_decimals(answer) else "integer"


def log10_error(prediction: str, answer: str) -> float | None:
  """log10(1 + |prediction - answer|); None if either does not parse.

  Parsed as the trainer's scorer parses (`train.tasks.arithmetic_mix`).
  """
  predicted, true = task.parse_number(prediction), task.parse_number(answer)
  if predicted is None or true is None:
    return None
  return task.log10_error(predicted, true)


def within_1_percent(prediction: str, answer: str) -> bool:
  """The prediction parses and is within 1% of the answer (the scorer's)."""
  predicted, true = task.parse_number(prediction), task.parse_number(answer)
  if predicted is None or true is None:
    return False
  return task.within_1_percent(predicted, true)


def is_exact(prediction: str, answer: str) -> bool:
  return prediction.strip() == answer.strip()


def score(predictions, problems) -> dict:
  """dict(exact_match, within_1_percent, log_error, unparsed) of
  ``predictions`` against (question, answer) ``problems`` in the same order:
  rates over all problems (an unparseable prediction is wrong), the mean
  log10 error of those that parse (nan if none), and how many do not."""
  pairs = [(p, a) for p, (_, a) in zip(predictions, problems)]
  parsed = [e for e in (log10_error(*pair) for pair in pairs) if e is not None]
  n = len(problems)
  return dict(
      exact_match=sum(is_exact(*pair) for pair in pairs) / n,
      within_1_percent=sum(within_1_percent(*pair) for pair in pairs) / n,
      log_error=float(np.mean(parsed)) if parsed else float("nan"),
      unparsed=n - len(parsed),
  )


def breakdown(predictions, problems, key) -> dict:
  """{bucket: (correct, total)} of exact match, ``key(question, answer)``
  naming each problem's bucket (None: left out)."""
  counts = collections.defaultdict(lambda: [0, 0])
  for prediction, (question, answer) in zip(predictions, problems):
    bucket = key(question, answer)
    if bucket is not None:
      counts[bucket][0] += is_exact(prediction, answer)
      counts[bucket][1] += 1
  return {b: tuple(c) for b, c in counts.items()}


# (name, bucket of (question, answer), bucket order); digits_report.md
# titles each (``breakdown_<name>``) and names its buckets (``bucket_<name>``).
BREAKDOWNS = (
    ("digits", lambda q, a: digits_bucket(a), DIGIT_BUCKETS),
    ("operation", lambda q, a: operation(q), ("add", "subtract")),
    ("decimals", lambda q, a: decimals_bucket(a), ("integer", "decimal")),
)


def answer_form(answer: str) -> str:
  """``'fraction'``, ``'decimal'`` or ``'integer'``: how the answer is
  written (arithmetic_mix's answers are integers or fractions)."""
  return "fraction" if "/" in answer else decimals_bucket(answer)


FORM = ("form", lambda q, a: answer_form(a), ("integer", "decimal", "fraction"))


def prepare_command(runs, data_dir, data=None, seen=None) -> str:
  """The command that generates the test problems the runs were scored on
  (and their training problems; needs the arithmetic-data extra).

  ``data``: the module and difficulty where the records name none (none:
  the paper's arithmetic__mixed); ``seen``: the training size where they
  do not name the problems read (default: the test size).
  """
  data = {**(data or {}), **(runs[0].get("data") or {})}
  names = ("module", "difficulty")
  options = "".join(f" --{k}={data[k]}" for k in names if data.get(k))
  size = runs[0]["num_test_examples"]
  seen = runs[0].get("problems_seen") or seen or size
  return (
      f"python -m train.prepare_data --data_dir={data_dir}{options} "
      f"--train_size={seen} --test_size={size} --workers=2"
  )


def dataset_pattern(runs, data_dir, data=None) -> str:
  """Where the runs' prepared data would be: any training size, the test
  split does not depend on it (``data`` as `prepare_command`'s)."""
  data = {**(data or {}), **(runs[0].get("data") or {})}
  prefix = ""
  if data.get("module"):
    module = data["module"].removeprefix("arithmetic__")
    prefix = f"{module}-{data.get('difficulty', 'easy')}_"
  size = runs[0]["num_test_examples"]
  return os.path.join(data_dir, task.NAME, f"{prefix}train*_test{size}_seed0")


def prepared_configs(pattern, seen) -> list[str]:
  """The dataset folders that ``pattern`` matches (any training size: it does
  not change the test split), the runs' own (``seen`` problems) first."""
  found = glob.glob(os.path.join(pattern, "*", "dataset_info.json"))
  names = sorted(pathlib.Path(path).parents[1].name for path in found)
  return sorted(names, key=lambda name: train_size(name) != seen)


def read_test_problems(data_dir, pattern, seen, kept):
  """(problems, source) of a prepared test split (a ``pattern`` glob under
  ``data_dir``), or of the report's copy under ``kept``; (None, None) where
  none is there. Reading prepared data refreshes its copy, so a fresh clone
  renders the same breakdowns. The runs' own dataset (``seen`` problems)
  comes first, prepared or kept, then any prepared one, then any copy."""
  copies = glob.glob(os.path.join(kept, os.path.basename(pattern) + ".json"))
  copies = sorted(pathlib.Path(path).stem for path in copies)
  prepared = prepared_configs(pattern, seen)
  rank = lambda name: (train_size(name) != seen, name not in prepared)
  config = min([*prepared, *copies], key=rank, default=None)
  if config is None:
    return None, None
  source = os.path.join(data_dir, task.NAME, config)
  copy = os.path.join(kept, f"{config}.json")
  if config not in prepared:
    print(
        f"the test problems of {config} are not prepared under {data_dir}; "
        f"reading the report's copy of them ({copy})",
        file=sys.stderr,
    )
    return [tuple(p) for p in common.read_json(copy)], source
  from train import input_pipeline  # pylint: disable=g-import-not-at-top

  split = input_pipeline.load_split(data_dir, "test", config_name=config)
  records = split.__getitems__(list(range(len(split))))
  problems = [input_pipeline.decode_record(r) for r in records]
  text = "[\n" + ",\n".join(json.dumps(list(p)) for p in problems) + "\n]\n"
  if not os.path.exists(copy) or pathlib.Path(copy).read_text() != text:
    os.makedirs(kept, exist_ok=True)
    common.write_text(copy, text)
  return problems, source


def train_size(source) -> int | None:
  """The training set's size, from the prepared data's name, if known."""
  match = re.search(r"(?:^|_)train(\d+)_test", os.path.basename(source or ""))
  return int(match.group(1)) if match else None


def load(runs, data_dir, results, data=None, seen=None, dataset=""):
  """(problems, source, command): the test split's (question, answer) pairs
  in the order the runs were scored and its path, from the prepared data or
  the copies kept beside ``results``; where it is not found, problems None,
  a warning on stderr and the command that prepares it (`prepare_command`'s
  ``data`` and ``seen``; ``dataset`` names it)."""
  pattern = dataset_pattern(runs, data_dir, data)
  kept = os.path.join(os.path.dirname(results) or ".", "test_problems")
  own = runs[0].get("problems_seen")
  problems, source = read_test_problems(data_dir, pattern, own, kept)
  if problems is not None:
    return problems, source, ""
  command = prepare_command(runs, data_dir, data, seen)
  print(
      f"warning: {dataset}{': ' if dataset else ''}no test problems under "
      f"{pattern}, so the breakdowns by answer length, operation and decimals "
      f"are left out of the report; prepare them with `{command}` (the "
      "arithmetic-data extra) and run the report again.",
      file=sys.stderr,
  )
  return None, pattern, command
