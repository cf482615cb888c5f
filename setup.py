"""Packaging for synapse_lite."""

from setuptools import find_packages, setup

REQUIREMENTS = [
    "Twisted[tls]>=23.8",
    "attrs>=23.1",
    "PyYAML>=6.0",
    "treq>=23.11",
    "prometheus_client>=0.17",
    "PyNaCl>=1.5",
    # The media repository's thumbnails.
    "Pillow>=10.0",
]

EXTRAS = {
    "postgres": ["psycopg2-binary>=2.9"],
    "redis": ["txredisapi>=1.4.10"],
    "spark": ["pyspark>=3.5", "pyarrow>=14"],
    "test": [
        "hypothesis>=6.90",
        "jsonschema>=4.0",
        "matrix-nio>=0.24",
        # A bridge framework, for the application service end-to-end test.
        "mautrix>=0.20",
        "mypy>=1.8,<2.5",
        "mypy-zope>=1.0",
        "ruff>=0.4",
        "types-PyYAML",
        "types-jsonschema",
    ],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})

setup(
    name="synapse_lite",
    version="0.1.0",
    description="A Twisted homeserver that scales out across worker processes",
    python_requires=">=3.11",
    packages=find_packages(include=["synapse_lite", "synapse_lite.*"]),
    package_data={"synapse_lite.storage": ["schema/*.sql", "schema/deltas/*.sql"]},
    install_requires=REQUIREMENTS,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["synapse-lite = synapse_lite.app.cli:main"]},
)
