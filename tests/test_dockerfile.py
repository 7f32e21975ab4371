"""What a task's Dockerfile pip-installs (`gyre.benchmarks.dockerfile`), read from real Dockerfile shapes."""

from __future__ import annotations

from gyre.benchmarks.dockerfile import pip_packages

DOCKERFILE = """\
FROM python:3.13-slim-bookworm
WORKDIR /app
RUN pip install numpy==2.3.0
RUN apt-get update && apt-get install -y curl && \\
    pip3 install --no-cache-dir -i https://example.invalid/simple "pandas==2.2.3" pyarrow==17.0.0 \\
    && python3 -m pip install --upgrade pip setuptools==80.9.0 wheel
RUN pip install -r requirements.txt -e . ./local_pkg https://example.invalid/x.whl numpy==2.3.0
run uv pip install --system 'scipy>=1.15'
COPY src/eigen.py /app/eigen.py
"""


def test_the_named_requirements_of_every_pip_install(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE)
    assert pip_packages(path) == ("numpy==2.3.0", "pandas==2.2.3", "pyarrow==17.0.0", "setuptools==80.9.0", "scipy>=1.15")


def test_no_dockerfile_no_packages(tmp_path):
    assert pip_packages(tmp_path / "Dockerfile") == ()
