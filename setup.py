"""What pyproject.toml cannot say: the Python client, kept in api/client/ so the tree stays
scheduler/, workers/, api/, is installed under the name ``hetsched``."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["scheduler*", "workers*", "api*"], exclude=["api.client*"]),
        "hetsched",
    ],
    package_dir={"hetsched": "api/client"},
)
