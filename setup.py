"""What pyproject.toml cannot say: the Python client, kept in api/client/ so the tree stays
scheduler/, workers/, api/, is installed under the name ``hetsched``. Namespace discovery
also lists the data folders (api/static, api/clusters, workers/data/corpus) as packages, so
their files install without setuptools warning that it would leave them out."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(
            include=["scheduler*", "workers*", "api*"],
            exclude=["api.client*", "*__pycache__*"],
        ),
        "hetsched",
    ],
    package_dir={"hetsched": "api/client"},
)
