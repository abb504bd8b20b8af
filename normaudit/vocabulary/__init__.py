"""What every layer shares and none owns: the norm kinds (:mod:`normaudit.vocabulary.kinds`), the dtype table
(:mod:`normaudit.vocabulary.dtypes`) and the canonical view of fx graph nodes with its bounded walks
(:mod:`normaudit.vocabulary.graph`). Imports nothing of normaudit but the report."""
