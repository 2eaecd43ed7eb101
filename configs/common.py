"""What every task's config shares: optimization, loss, parallelism, logging.

A task config (configs/arithmetic_mix.py, configs/clock_time.py) starts from
`base_config(method)` and sets ``task``, the data fields and its defaults.
"""

from absl import flags
import ml_collections
from ml_collections import config_flags

from ntil_jax import kernels
from ntil_jax import losses

# The paper's methods: the experiment grids iterate over these.
METHODS = ("ce", "emd", "ntl_mse", "soft_label", "ntil")
# NTIL's peers that the grids run, in their peers groups, by name (DEL,
# SMMD, the number-level NTL); a peer's rows appear in a report once it has
# a record.
PEER_METHODS = ("del", "smmd", "nl_ntl")
# Every method the trainer takes (--config=FILE:METHOD): the paper's and
# every peer of ntil_jax.losses.PEER_LOSSES.
TRAINER_METHODS = METHODS + losses.PEER_LOSSES
# Fields added to `base_config` after runs were recorded, with the default
# that every earlier run had: a run recorded without one resumes as if it
# held its default, and an experiment's config hash leaves it out while it
# holds its default (experiments/common.py), so recorded cells keep theirs.
ADDED_FIELDS = {
    "train_stream": False,
    "param_dtype": "float32",
    # Task fields (arithmetic_mix, arithmetic_mix_llm): numbers in tokens
    # of 1-3 digits.
    "digit_chunks": False,
    "number_tokens": False,
    # arithmetic_mix_llm: the prompt and the answer tokenized as one text.
    "tokenize_joined": False,
    # arithmetic_mix_llm: a prompt's BOS by model family ("llama"), or the
    # one the snapshot's tokenizer adds ("tokenizer").
    "prompt_bos": "llama",
}
# When and how much the trainer logs, evaluates and saves: fields that
# reach no traced program (the step's and the resume checks' business).
CADENCE_FIELDS = (
    "log_every_steps",
    "eval_every_steps",
    "eval_examples",
    "eval_batch_size",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "num_samples",
)
_FUSED_MODES = {"auto": "auto", "true": True, "false": False}


def fused_mode(value):
  """``config.fused_loss``: True, False, 'auto' or an implementation's name.

  Accepts bools, the strings 'auto', 'true', 'false' in any case, and the
  fused path's implementations (``ntil_jax.kernels.NAMES``: 'chunked',
  'tokamax', 'tokamax:xla', ...), which take the fused path with that
  implementation; True takes it with the backend's default. ValueError
  otherwise.
  """
  if isinstance(value, bool):
    return value
  if isinstance(value, str):
    word = value.strip().lower()
    if word in _FUSED_MODES:
      return _FUSED_MODES[word]
    if word in kernels.NAMES:
      return word
  raise ValueError(
      f"fused_loss must be True, False, 'auto' or one of "
      f"{', '.join(kernels.NAMES)}; got {value!r}."
  )


def fused_implementation(value):
  """The fused path's implementation a ``fused_loss`` value names, or None."""
  mode = fused_mode(value)
  return mode if isinstance(mode, str) and mode != "auto" else None


class _FusedLossParser(flags.ArgumentParser):
  """``--config.fused_loss=True|False|auto`` on the command line."""

  def parse(self, argument):
    return fused_mode(argument)

  def flag_type(self):
    return "True, False, 'auto' or an implementation of the fused path"


# fused_loss is the one config field of type `object` (a bool or 'auto'), so
# config_flags parses it with this parser.
config_flags.register_flag_parser_for_type(object, _FusedLossParser())


def check_method(method: str) -> str:
  """The method named after the colon in --config=FILE:METHOD ('ntil' if '')."""
  method = method or "ntil"
  if method not in TRAINER_METHODS:
    raise ValueError(
        f"unknown method {method!r} in --config=...:{method}; "
        f"choose one of {', '.join(TRAINER_METHODS)}."
    )
  return method


# Each method's own loss settings, with their defaults; a method reads only
# its own (loss_kwargs), and the trainer warns where another's is changed.
LOSS_SETTINGS = dict(
    sigma=0.2,
    alpha=0.2,
    beta=0.2,
    tau=0.1,
    gumbel_noise=0.0,
    soft_label_eta=0.5,
    soft_label_width=1.0,
)
METHOD_SETTINGS = dict(
    ntil=("sigma", "alpha", "beta", "tau", "gumbel_noise"),
    soft_label=("soft_label_eta", "soft_label_width"),
)
# The numeric term's weight and scaling, with their defaults: read by every
# method but 'ce', which has no numeric term.
TERM_SETTINGS = dict(lam=0.3, weighting="sum")


def base_config(method: str) -> ml_collections.ConfigDict:
  """Fields common to every task, for one loss ``method``."""
  config = ml_collections.ConfigDict()
  config.task = ""  # a key of train/tasks.TASKS

  # Data (written by `python -m train.prepare_data --task=...`).
  config.data_dir = ""
  config.dataset_config = (
      ""  # which prepared dataset, if data_dir holds several
  )
  config.max_question_len = 80
  config.max_answer_len = 12
  # grain reading processes (0: threads); each exits with the trainer, even
  # one killed outright (SIGKILL, the out-of-memory killer).
  config.worker_count = 0
  # Render each train example as it is read, never one twice, instead of
  # reading a prepared train split (tasks that render their data; see
  # train/streams.py; worker_count does not apply). The test split stays
  # the prepared one. Fixed for a run: a resume may not change it.
  config.train_stream = False

  # Model: a size from train/models.py MODEL_SIZES.
  config.model = "small"
  config.dtype = "float32"  # the computation's: matmuls and activations
  # The parameters' and the optimizer's (float32 "master" weights under
  # bfloat16 computation; bfloat16 parameters lose small updates).
  config.param_dtype = "float32"
  config.image_size = 0  # image tasks: side of the image prefix
  config.image_channels = (16, 32, 64)  # image encoder's hidden convs

  # Optimization.
  config.seed = 0  # fixes the init, the data order and the Gumbel noise
  config.batch_size = 64  # global, over all hosts and devices
  config.train_steps = 2000
  config.learning_rate = 1e-3
  config.warmup_steps = 100
  # Cosine decay horizon; 0 means train_steps. Fix it to resume a run with a
  # larger train_steps on the same schedule.
  config.lr_decay_steps = 0
  # Decoupled, on every parameter (norm scales and embeddings included), as
  # optax.adamw's default mask.
  config.weight_decay = 0.01
  config.grad_clip_norm = 1.0

  # Loss: CE on answer tokens + lam * numeric loss on their digits.
  config.method = method
  config.lam = TERM_SETTINGS["lam"]
  # "sum"; "reference": the NTIL authors' scaling of a token-summed aux;
  # "authors": their loss whole (their per-sample means; NTIL's numbers split
  # at '.', as their code splits them; the peers' joined, as theirs).
  config.weighting = TERM_SETTINGS["weighting"]
  # NTIL: place-value weighting (sigma), relative and magnitude deviations
  # (alpha, beta), Gumbel-softmax temperature (tau) and noise scale (0:
  # none); soft labels' mixing weight and width (LOSS_SETTINGS).
  for name, default in LOSS_SETTINGS.items():
    config[name] = default
  # Control: CE with weight (1 + digit_ce_weight) on digit tokens, for
  # method 'ce' only, refused with another ("more gradient on digits" without
  # ordinal structure).
  config.digit_ce_weight = 0.0
  # CE+loss from hidden states, no [N, V] logits: True, False or "auto" (the
  # fused path only where the logits would not fit; train.step).
  config.fused_loss = ml_collections.FieldReference(False, field_type=object)
  config.fused_chunk_size = 0  # tokens per chunk; 0 means automatic

  # Parallelism: mesh ('data', 'fsdp'); fsdp=1 is pure data parallelism.
  config.fsdp = 1

  # Logging, evaluation, checkpoints.
  config.log_every_steps = 50
  config.eval_every_steps = 500  # and at the last step; 0: never evaluated
  config.eval_examples = 1000  # 0 means the whole test split
  config.eval_batch_size = 250
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 3
  config.num_samples = 5  # sample predictions printed after the final eval
  return config


def loss_kwargs(config) -> dict:
  """The keyword arguments of ``ntil_jax.numeric_token_loss`` for ``config``."""
  if config.method == "ntil":
    return dict(
        sigma=config.sigma,
        alpha=config.alpha,
        beta=config.beta,
        tau=config.tau,
        noise_scale=config.gumbel_noise,
    )
  if config.method == "soft_label":
    return dict(eta=config.soft_label_eta, width=config.soft_label_width)
  return {}
