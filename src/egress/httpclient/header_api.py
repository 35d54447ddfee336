"""One header of a finished transfer, read from libcurl after the transfer (``curl_easy_header``)
instead of through a header callback.

Why: pycurl exposes libcurl's headers only through ``CURLOPT_HEADERFUNCTION``, a Python call per
header line with the GIL taken back each time (seven lines for a plain nginx answer), and the HTTP
sinks ask every request for ``Retry-After`` although only a 429 or 503 needs it. libcurl keeps every
header of a transfer until the handle's next transfer starts and answers ``curl_easy_header`` (libcurl
7.84+, ``curl/header.h``) for any of them; pycurl does not wrap that function, so it is called here
through ``ctypes`` on the easy handle that pycurl holds, once per 429 or 503 and never otherwise.

The ``CURL *`` of a ``pycurl.Curl`` is its object's field after ``dict`` and ``weakreflist``
(pycurl's ``src/pycurl.h``, ``CurlObject``, unchanged since pycurl 7.43). That reading is used only
when it is proven on a fresh handle at first use: the field sits where the type's
``__weakrefoffset__`` says the struct is laid out so, and ``curl_easy_getinfo(CURLINFO_PRIVATE)`` on
the pointer read gives back the Python object itself (pycurl sets ``CURLOPT_PRIVATE`` to it). If
anything does not hold (another pycurl, a libcurl without the function, no ``ctypes``),
:data:`AVAILABLE` is False and ``egress.httpclient.curl`` captures the header lines with the callback
as before.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pycurl

CURLINFO_PRIVATE = 0x100000 + 21  # CURLINFO_STRING + 21 (curl/curl.h)
CURLH_HEADER = 1 << 0  # the final response's headers, not 1xx, trailers or CONNECT (curl/header.h)
CURLHE_OK = 0
LAST_REQUEST = -1  # curl_easy_header's ``request``: the last request of the transfer (no redirect is followed)


class _Header(ctypes.Structure):
    """``struct curl_header`` (curl/header.h)."""

    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p), ("amount", ctypes.c_size_t),
                ("index", ctypes.c_size_t), ("origin", ctypes.c_uint), ("anchor", ctypes.c_void_p)]


_HeaderPointer = ctypes.POINTER(_Header)


def _easy_header_function() -> tuple[Any, int] | None:
    """libcurl's ``curl_easy_header`` (of the libcurl pycurl is linked with) and the offset of the
    ``CURL *`` in a ``pycurl.Curl`` object, or None when either cannot be proven."""
    try:
        # pycurl 7.49+ is a package whose extension is pycurl._pycurl; earlier, pycurl is the extension.
        extension = getattr(pycurl, "_pycurl", pycurl)
        # PyDLL: called with the GIL held (each call is a lookup in memory, never a wait). dlsym on
        # the extension's handle finds libcurl's symbols among its dependencies.
        library = ctypes.PyDLL(extension.__file__)
        easy_header = library.curl_easy_header
        getinfo = library.curl_easy_getinfo
    except (AttributeError, OSError, TypeError):
        return None
    pointer = ctypes.sizeof(ctypes.c_void_p)
    offset = pycurl.Curl.__weakrefoffset__ + pointer  # CurlObject: HEAD, dict, weakreflist, handle
    if pycurl.Curl.__weakrefoffset__ != object.__basicsize__ + pointer or pycurl.Curl.__basicsize__ < offset + pointer:
        return None  # not the struct laid out as read above
    easy_header.restype = ctypes.c_int
    easy_header.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                            ctypes.POINTER(_HeaderPointer)]
    getinfo.restype = ctypes.c_int
    getinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    probe = pycurl.Curl()
    try:
        handle = ctypes.c_void_p.from_address(id(probe) + offset).value
        private = ctypes.c_void_p()
        if handle is None or getinfo(handle, CURLINFO_PRIVATE, ctypes.byref(private)) != 0:
            return None
        if private.value != id(probe):
            return None
    finally:
        probe.close()
    return easy_header, offset


_found = _easy_header_function()
AVAILABLE = _found is not None


def final_header(handle: pycurl.Curl, name: bytes) -> str | None:
    """The value of header ``name`` (ASCII, any case) in the final response of ``handle``'s last
    transfer, the last one when it is repeated, as libcurl keeps it (surrounding blanks removed),
    decoded as latin-1; None when the response has no such header. Only while no other transfer has
    started on ``handle``; only when :data:`AVAILABLE`."""
    assert _found is not None
    easy_header, offset = _found
    pointer = ctypes.c_void_p.from_address(id(handle) + offset).value
    found = _HeaderPointer()
    if easy_header(pointer, name, 0, CURLH_HEADER, LAST_REQUEST, ctypes.byref(found)) != CURLHE_OK:
        return None
    amount = found.contents.amount
    if amount > 1 and easy_header(pointer, name, amount - 1, CURLH_HEADER, LAST_REQUEST,
                                  ctypes.byref(found)) != CURLHE_OK:
        return None
    value = found.contents.value
    return value.decode("latin-1") if value is not None else ""
