"""The release of this distribution (awl-gateway): its one home, read by hatchling for the
package metadata and by everything that introduces itself (``awl --version``, the gateway to
its clients and upstreams, telemetry's instrumentation scope). ``awl.documents`` exports it
as ``RELEASE``, for the gateway (which imports only the layers' interfaces)."""

__version__ = "0.1.0"
