# The trainvitals server and dashboard. Agents need only `pip install trainvitals`.
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
RUN pip install --no-cache-dir ".[server]" && rm -rf /src

WORKDIR /data
ENV TRAINVITALS_HOST=0.0.0.0 \
    TRAINVITALS_PORT=8600 \
    TRAINVITALS_DB=/data/trainvitals.db
EXPOSE 8600
HEALTHCHECK --interval=10s --timeout=3s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8600/healthz')"
CMD ["trainvitals", "serve"]
