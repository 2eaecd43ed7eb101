"""How every report and figure names and colours the losses and variants."""

# How the reports name each loss (CE plus its numeric term) and the variants
# that several grids run.
LABELS = {
    "ce": "CE",
    "emd": "CE + EMD",
    "ntl_mse": "CE + NTL-MSE",
    "soft_label": "CE + soft labels",
    "ntil": "CE + NTIL",
    # NTIL's peers (ntil_jax.losses.PEER_LOSSES).
    "del": "CE + DEL",
    "smmd": "CE + SMMD",
    "nl_ntl": "CE + NL-NTL",
}
# The controls of every grid: digit-weighted CE and NTIL with the authors'
# scaling.
CONTROLS = ("ce_digit_weighted", "ntil_reference")
VARIANT_LABELS = {
    "ce_digit_weighted": "CE, digit tokens weighted 1 + 0.3",
    "ntil_reference": "CE + NTIL, authors' scaling",
    "exp_off": "NTIL, Exp off (sigma = 0)",
    "rel_off": "NTIL, Rel off (alpha = 0)",
    "mag_off": "NTIL, Mag off (beta = 0)",
}


def label(key, variants=None) -> str:
  """How the reports name a method, or a variant (of ``variants``, default
  `VARIANT_LABELS`)."""
  return LABELS.get(key) or (variants or VARIANT_LABELS)[key]


# One colour per loss in every figure: CE, the reference, in black; the
# numeric losses and the control in the first colours of matplotlib's cycle;
# NTIL's peers in named colours outside it (C6-C9 go to other variants).
COLORS = {
    "ce": "k",
    "emd": "C0",
    "ntl_mse": "C1",
    "soft_label": "C2",
    "ntil": "C3",
    "ce_digit_weighted": "C4",
    "ntil_reference": "C5",
    "del": "saddlebrown",
    "smmd": "teal",
    "nl_ntl": "darkgoldenrod",
}


def color(key, others=()) -> str:
  """``key``'s colour: its own, else by its place in ``others`` (C6 on)."""
  if key in COLORS:
    return COLORS[key]
  others = [k for k in others if k not in COLORS]
  return f"C{6 + others.index(key) % 4}" if key in others else "0.5"
