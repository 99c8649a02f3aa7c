"""The web dashboard: :func:`create_app` builds an ASGI app over a store (docs/dashboard.md).

Needs the ``dashboard`` extra (``pip install 'durablesched[dashboard]'``: Starlette,
Jinja2, uvicorn, python-multipart). ``import durablesched`` never imports this
package, and neither does any command but ``durablesched dashboard``.

Where things are: the routes and the app in :mod:`.app`, what each page reads in
:mod:`.reads`, the actions in :mod:`.actions`, the token, CSRF and headers in
:mod:`.security`, the chart in :mod:`.chart`, the task list's filters in
:mod:`.filters`; templates and static files beside them.
"""

from __future__ import annotations

from durablesched.errors import ConfigurationError

try:
    import jinja2  # noqa: F401 - checked here for a clear error
    import python_multipart  # noqa: F401 - forms
    import starlette  # noqa: F401
except ImportError:  # pragma: no cover - the extra is installed wherever tests run
    raise ConfigurationError(
        "the dashboard needs its extra: pip install 'durablesched[dashboard]'"
    ) from None

from durablesched.dashboard.app import create_app as create_app

__all__ = ["create_app"]
