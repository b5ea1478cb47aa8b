"""A toy quantkit plugin (tests/test_plugins.py installs it; tests/test_registry.py registers its
method and task in-process). Each module imports only what its entry needs: none imports torch."""
