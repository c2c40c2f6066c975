"""Who may write: everyone reads; writes (launch, cancel, annotate, save a budget) need a user.

Three modes, chosen at launch:

* ``open`` — a researcher's own machine with no ``--auth``: every visitor may write; the author
  is the local login name.
* ``password`` — ``envace studio --auth user:pass``: anonymous visitors browse read-only; the
  "Sign in" box on the page unlocks writes for the session. Unlike gradio's ``auth=`` (a login
  wall in front of the whole app), this keeps the studio browsable without an account.
* ``hf`` — on a Hugging Face Space (``SPACE_ID`` set): anonymous visitors browse read-only; the
  Hugging Face login button signs them in and their HF username becomes the author. Only the
  Space's writers (its owner and ``$ENVACE_WRITERS``, ``studio.space.writers``) may write: any
  Hugging Face account can sign in, so signing in alone grants nothing.

The signed-in user lives in server-side session state (``gr.State``), never in a value the
browser could forge.
"""

from __future__ import annotations

import getpass
import hmac
import os
from dataclasses import dataclass

from studio.space import writers

MODES = ("open", "password", "hf")


class AuthError(PermissionError):
    """A write was refused or a sign-in failed; the message says what to do."""


@dataclass(frozen=True)
class AuthPolicy:
    """The studio's write policy for this process."""

    mode: str = "open"
    credentials: tuple[tuple[str, str], ...] = ()
    writers: frozenset[str] = frozenset()  # hf mode: who may write ("*": every signed-in user)

    @classmethod
    def from_settings(cls, auth: str | None = None, space_id: str | None = None) -> AuthPolicy:
        """Policy from ``--auth user:pass`` and the Space id (``$SPACE_ID`` when None)."""
        space_id = os.environ.get("SPACE_ID") if space_id is None else space_id
        if space_id:
            return cls(mode="hf", writers=writers())
        if auth:
            user, sep, password = auth.partition(":")
            if not sep or not user or not password:
                raise AuthError(f"--auth must look like user:pass, got {auth!r}")
            return cls(mode="password", credentials=((user, password),))
        return cls(mode="open")

    def sign_in(self, user: str, password: str) -> str:
        """Check a user name and password (``password`` mode); returns the user name."""
        if self.mode != "password":
            raise AuthError(
                "sign in with the Hugging Face button"
                if self.mode == "hf"
                else "this studio is open: no sign-in needed"
            )
        for known_user, known_password in self.credentials:
            # compare_digest: no timing hint about how much of the password matched
            if hmac.compare_digest(user.encode(), known_user.encode()) and hmac.compare_digest(
                password.encode(), known_password.encode()
            ):
                return user
        raise AuthError("wrong user name or password")

    def author(self, user: str | None, action: str = "make changes") -> str:
        """The author to record for a write by ``user``; raises AuthError when not allowed."""
        if user and self.mode == "hf" and not self.may_write(user):
            owners = ", ".join(sorted(self.writers)) or "nobody (no SPACE_AUTHOR_NAME)"
            raise AuthError(
                f"{user} may browse this Space but not {action}: writes are limited to "
                f"{owners} (the owner can add users with ENVACE_WRITERS)"
            )
        if user:
            return user
        if self.mode == "open":
            return getpass.getuser() or "local"
        how = "with the Hugging Face button" if self.mode == "hf" else "in the Sign in box"
        raise AuthError(f"read-only: sign in {how} (top of the page) to {action}")

    def author_name(self, user: str | None) -> str:
        """Who is looking, for reads such as "labelled by me" ("" for an anonymous visitor)."""
        if user:
            return user
        return (getpass.getuser() or "local") if self.mode == "open" else ""

    def may_write(self, user: str) -> bool:
        """Whether signed-in ``user`` may write (always, outside ``hf`` mode)."""
        return self.mode != "hf" or "*" in self.writers or user in self.writers

    def banner(self, user: str | None) -> str:
        """One line for the page header saying who you are and what you can do."""
        if user and not self.may_write(user):
            return (
                f"Signed in as **{user}**: browsing read-only (writes are for this Space's owner)."
            )
        if user:
            return f"Signed in as **{user}**: you can launch jobs, annotate and save budgets."
        if self.mode == "open":
            return "Local studio: writes are recorded as your login name."
        return "Browsing **read-only**. Sign in to launch jobs, annotate and save budgets."
