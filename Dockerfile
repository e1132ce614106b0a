# The image `wirekit serve k8s` names by default (wirekit:<version>): wirekit with its
# compiled twins, the `serve`, `pg` and `uvloop` extras, and the sample's handler module.
#
# It is installed from a wheelhouse built outside the container (the build reaches no
# package index): wirekit's wheel for the base image's Python, and the wheels of everything
# it needs.  scripts/build-image.sh does it all on a machine with no registry (the base made
# from Debian's packages, the wheelhouse, the image, then the image run as the manifests run
# it); by hand, with a registry's Python image as the base:
#
#   pip wheel --wheel-dir wheelhouse '.[serve,pg,uvloop]'      # on a Python 3.11, like the base
#   docker build --build-arg BASE=python:3.11-slim -t wirekit:0.1.0 .
#
# Your models' handler modules go into an image of your own, FROM this one, on PYTHONPATH
# (COPY zoo/ /opt/wirekit/models/zoo/), named with `wirekit serve k8s --image`.

# a Debian-like image with python3 (and its venv module), groupadd and useradd
ARG BASE=python:3.11-slim
FROM ${BASE}

# no compiler, no sources, no index: the wheels only, into a virtualenv of the image's own;
# the image is refused if the compiled twins do not load
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /opt/wirekit/venv \
    && /opt/wirekit/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse \
        'wirekit[serve,pg,uvloop]' \
    && rm -rf /tmp/wheelhouse \
    && WIREKIT_REQUIRE_FAST=1 /opt/wirekit/venv/bin/python -c "import wirekit, sys; from wirekit import clipper, mip, y2, zmtp; sys.exit(0 if {wirekit.IMPLEMENTATION, clipper.IMPLEMENTATION, mip.IMPLEMENTATION, y2.IMPLEMENTATION, zmtp.IMPLEMENTATION} == {'fast'} else 'wirekit: the compiled twins did not load')"
COPY samples/tiny_model.py /opt/wirekit/models/
ENV PATH=/opt/wirekit/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/wirekit/models \
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
