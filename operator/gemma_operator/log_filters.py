"""How kopf's log lines read in the operator's log: what matters said at the level it deserves.

kopf logs at DEBUG that it paused its watches (its peering CRDs missing, say), after which only the
operator's poller moves resources: that is said at WARNING. And kopf logs every retried request at
ERROR, the API server's answers while it starts included: a watch cache still filling answers
429 "storage is (re)initializing" with Retry-After (k8s.io/apiserver, pkg/storage/cacher), and a server
still registering its routes answers "the request has been made before all known HTTP paths have been
installed" (k8s.io/apiserver, pkg/server/filters). Both are the server warming up, retried and
answered seconds later: said at INFO. Anything else kopf retries stays an ERROR.

And kopf says at INFO that a handler succeeded, once for every watch event (four lines for each
fine-tune it creates, most of them echoes of the operator's own writes, which it skips): its
per-object logger speaks from WARNING up, its failures and retries included.
"""

from __future__ import annotations

import logging

WARMING_UP = ("storage is (re)initializing", "before all known HTTP paths have been installed")


class PausedWatchWarning(logging.Filter):
    """On kopf's watching logger: its one DEBUG line worth a WARNING, and none of its other DEBUG lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            return True
        if not record.getMessage().startswith("Pausing the watch-stream"):
            return False
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class ServerWarmingUp(logging.Filter):
    """On the handlers: a retried request the API server answered while starting is INFO, not ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.name.startswith("kopf"):
            text = record.getMessage()
            if "will retry" in text and any(answer in text for answer in WARMING_UP):
                record.msg, record.args = f"the API server is starting; {text}", None
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install(handlers: list[logging.Handler] | None = None) -> None:
    """Both filters: PausedWatchWarning on kopf's watching logger, ServerWarmingUp on every handler of
    the root logger (kopf logs through per-object loggers too, so no one logger sees all its retries);
    kopf's per-object logger at WARNING."""
    watching = logging.getLogger("kopf._cogs.clients.watching")
    if not any(isinstance(f, PausedWatchWarning) for f in watching.filters):
        watching.addFilter(PausedWatchWarning())
    if watching.getEffectiveLevel() > logging.DEBUG:
        watching.setLevel(logging.DEBUG)
    objects = logging.getLogger("kopf.objects")
    if objects.level == logging.NOTSET:  # unless configured otherwise
        objects.setLevel(logging.WARNING)
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not any(isinstance(f, ServerWarmingUp) for f in handler.filters):
            handler.addFilter(ServerWarmingUp())
