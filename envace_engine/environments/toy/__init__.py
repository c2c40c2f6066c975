"""Suite ``toy``: three tiny worlds (``worlds``), their task templates (``templates``) and the
suite with its partial-credit score (``suite``)."""
