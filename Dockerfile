# The sfaas runtime image: coordinator and workers (`sfaas coordinator`, `sfaas worker`).
# Your app's code is copied in (or mounted) and named with SFAAS_APP=package.module:app.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sfaas ./sfaas
COPY statestores ./statestores
COPY remotes ./remotes
COPY coordinator ./coordinator
COPY worker ./worker
COPY launcher ./launcher
COPY gateway ./gateway
COPY examples ./examples
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["sfaas"]
