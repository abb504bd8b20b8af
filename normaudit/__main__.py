"""``python -m normaudit``: the ``normaudit`` command (:func:`normaudit.cli.run`)."""
from normaudit.cli import run

run()
