from normaudit.cli import run

run()
