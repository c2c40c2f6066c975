"""The Space's entry point (``python app.py`` from the repository root; the Dockerfile's CMD).

At the root so that ``import studio`` resolves to the repository's package without installing
it (``python studio/app.py`` would put ``studio/`` first on ``sys.path``).
"""

from studio.app import serve_space

if __name__ == "__main__":
    serve_space()
