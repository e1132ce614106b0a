# The image `wirekit serve k8s` names by default (wirekit:<version>): wirekit with its
# compiled twins, the `serve`, `pg` and `uvloop` extras, and the sample's handler module.
#
#   docker build -t wirekit:0.1.0 .
#
# Your models' handler modules go into an image of your own, FROM this one, on PYTHONPATH
# (COPY zoo/ /opt/wirekit/models/zoo/), named with `wirekit serve k8s --image`.

ARG PYTHON=3.11

# --- build: compile the Cython twins into a wheel, with the wheels of everything it needs
FROM python:${PYTHON}-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY wirekit ./wirekit
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[serve,pg,uvloop]'

# --- run: no compiler, no sources; a non-root user
FROM python:${PYTHON}-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'wirekit[serve,pg,uvloop]' \
    && rm -rf /wheels \
    && WIREKIT_REQUIRE_FAST=1 python -c "import wirekit, sys; from wirekit import clipper, mip, y2, zmtp; sys.exit(0 if {wirekit.IMPLEMENTATION, clipper.IMPLEMENTATION, y2.IMPLEMENTATION, zmtp.IMPLEMENTATION} == {'fast'} else 'wirekit: the compiled twins did not load')"
COPY samples/tiny_model.py /opt/wirekit/models/
ENV PYTHONPATH=/opt/wirekit/models \
    PYTHONUNBUFFERED=1
# the user and group of the manifests' securityContext (wirekit.serve.control.k8s.RUN_AS);
# the dispatcher's data volume is mounted at its home, /var/lib/wirekit
RUN groupadd --system --gid 10001 wirekit \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/wirekit --create-home \
        --shell /usr/sbin/nologin wirekit
USER 10001:10001
WORKDIR /var/lib/wirekit
ENTRYPOINT ["wirekit"]
CMD ["--help"]
