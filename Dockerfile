# The Hugging Face Space (README header: sdk: docker). Docker rather than sdk: gradio because the
# embedded model and the BFCL data must be installed with --no-deps, which a Space's
# requirements.txt cannot say, and because the lock (constraints.txt) and the project itself
# can only be installed once the repository is in the image. Everything is installed here, at
# build time: the running app never calls pip.
FROM python:3.11-slim

# Spaces run the container as uid 1000
RUN useradd -m -u 1000 user
WORKDIR /home/user/app
COPY --chown=user . .
RUN sh scripts/space_install.sh && rm -rf /root/.cache

USER user
ENV HOME=/home/user \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_SERVER_NAME=0.0.0.0 \
    PORT=7860
EXPOSE 7860
CMD ["python", "app.py"]
