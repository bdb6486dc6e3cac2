"""Package layout (the rest of the metadata is in pyproject.toml): the code packages, and the
configs of ``conf/`` shipped as ``pipeline/conf`` (package data), so an installed wheel composes
its configs outside the repository (pipeline/conf_files.py finds either)."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["pipeline*", "rewards*", "sandbox*", "bench*"]) + ["pipeline.conf"],
    package_dir={"pipeline.conf": "conf"},
    package_data={
        "pipeline.conf": ["*.yaml", "*/*.yaml", "*/*/*.yaml"],
        "rewards": ["tasks/builtin/**/*.py", "corpus/**/*.py"],
    },
    include_package_data=False,
)
