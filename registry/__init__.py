"""The mesh registry: where agents register and find each other.

    mesh-registry --port 8400 --data-dir .mesh/registry   # or python -m registry, mesh registry

Modules: ``cli`` (the command: flags over the environment, exit codes), ``settings``, ``app``
(FastAPI app and lifespan), ``api`` (JSON under /v1), ``page`` (operator page), ``store``
(``RegistryStore`` interface) and ``sqlite_store``, ``card`` (card fetch and validation),
``prober`` (liveness), ``catalog`` (queries), ``server`` (uvicorn runner).
"""
