"""Dynamic probes: analyses that *run the model* or a piece of it (the static facts, :mod:`normaudit.facts`,
only read the captured graph). Each probe is a pass of the fact pipeline (:mod:`normaudit.pipeline`).

- :mod:`normaudit.probes.size`: re-run on fake tensors with the spatial/sequence axes resized (``--probe size``;
  by default on small graphs).
- :mod:`normaudit.probes.batch`: a small real copy in train mode, is each example normalised alone (``--probe batch``).
- :mod:`normaudit.probes.formula_confirm`: each small norm module alone on crafted rows, which reference formula
  (:mod:`normaudit.probes.reference`, :mod:`normaudit.probes.formula`) it computes, and its half-precision
  behaviour.
- :mod:`normaudit.probes.numerics`: the model run for real in the audited dtype (``--probe numerics``).
- :mod:`normaudit.probes.monitor`: the same watch kept on during training (``normaudit.monitor``).
- :mod:`normaudit.probes.common`: shared helpers (a real copy of a meta model, calling a model on its inputs).
"""
