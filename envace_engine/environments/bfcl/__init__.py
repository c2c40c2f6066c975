"""BFCL v4: the held-out multi-turn suite (``suite``), the backends of the ``bfcl-eval`` package
(``backends``), BFCL's checker (``checker``) and suite ``bfcl-gen`` of generated tasks over the
same backends (``gen``, with templates in ``gen_accounts`` and ``gen_office``)."""
