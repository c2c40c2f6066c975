"""The reproduction study (docs/study.md): arms trained from one SFT checkpoint, evaluated alike.

``config`` (the typed study tree and the arms), ``state`` (what is done, kept in the study's run
folder so a killed study resumes), ``stats`` (bootstrap confidence intervals), ``evaluation``
(held-out evaluation of one checkpoint: test-time rehearsal settings and fidelity), ``runner``
(the whole study, resumable), ``report`` (the paper-shaped table, curves and verdicts). May
import every engine layer but the CLI (docs/architecture.md).
"""
