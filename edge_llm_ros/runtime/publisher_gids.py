"""Publisher gids under rclpy: who sent a message, and who a publisher of ours is.

rmw gives every message's info the gid of the publisher that sent it (rmw_message_info_t's
`publisher_gid`: the DDS writer's GUID on Fast DDS, a hash of the endpoint's liveliness token on
rmw_zenoh). rclpy Jazzy drops it: the dict a message-info callback gets holds the timestamps and
sequence numbers only, and a Publisher has no gid either. There is no rclpy call that gives it, so
this module asks rcl and rmw for it through ctypes, from the library rclpy itself runs on:

- :func:`take_with_info` takes a subscription's next message as rcl's serialized message with its
  full rmw_message_info_t (rcl_take_serialized_message) and deserializes it with rclpy: (message,
  rclpy's info dict plus ``publisher_gid``). :class:`TakesPublisherGids` makes an rclpy executor
  take that way for every subscription whose callback takes message info (rclpy's rule: two
  parameters); runtime.ros.spin's executors do.
- :func:`publisher_gid` is a publisher's own gid (rmw_get_gid_for_publisher).

The layouts below are rmw's Jazzy headers (rmw/types.h: RMW_GID_STORAGE_SIZE 16) and rcutils'.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from rclpy.exceptions import InvalidHandle
from rclpy.executors import await_or_execute
from rclpy.serialization import deserialize_message
from rclpy.subscription import Subscription

GID_SIZE = 16  # RMW_GID_STORAGE_SIZE
RCL_RET_OK, RCL_RET_SUBSCRIPTION_TAKE_FAILED = 0, 401
UNSUPPORTED = 2**64 - 1  # RMW_MESSAGE_INFO_SEQUENCE_NUMBER_UNSUPPORTED: rclpy says None


class _Gid(ctypes.Structure):  # rmw_gid_t
    _fields_ = [("implementation_identifier", ctypes.c_char_p), ("data", ctypes.c_uint8 * GID_SIZE)]


class _MessageInfo(ctypes.Structure):  # rmw_message_info_t
    _fields_ = [("source_timestamp", ctypes.c_int64), ("received_timestamp", ctypes.c_int64),
                ("publication_sequence_number", ctypes.c_uint64), ("reception_sequence_number", ctypes.c_uint64),
                ("publisher_gid", _Gid), ("from_intra_process", ctypes.c_bool)]


class _Allocator(ctypes.Structure):  # rcutils_allocator_t: four function pointers and a state
    _fields_ = [("allocate", ctypes.c_void_p), ("deallocate", ctypes.c_void_p), ("reallocate", ctypes.c_void_p),
                ("zero_allocate", ctypes.c_void_p), ("state", ctypes.c_void_p)]


class _Bytes(ctypes.Structure):  # rcutils_uint8_array_t, which rcl_serialized_message_t is
    _fields_ = [("buffer", ctypes.POINTER(ctypes.c_uint8)), ("buffer_length", ctypes.c_size_t),
                ("buffer_capacity", ctypes.c_size_t), ("allocator", _Allocator)]


class _ErrorString(ctypes.Structure):  # rcutils_error_string_t
    _fields_ = [("text", ctypes.c_char * 1024)]


@functools.cache
def _rcl() -> ctypes.CDLL:
    """librcl as rclpy loaded it; rmw's and rcutils' functions resolve through its dependencies (the
    RMW implementation, or rmw_implementation where the RMW is chosen at run time)."""
    from ament_index_python.packages import get_package_prefix

    lib = ctypes.CDLL(os.path.join(get_package_prefix("rcl"), "lib", "librcl.so"))
    lib.rcl_take_serialized_message.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Bytes),
                                                ctypes.POINTER(_MessageInfo), ctypes.c_void_p]
    lib.rcl_publisher_get_rmw_handle.argtypes = [ctypes.c_void_p]
    lib.rcl_publisher_get_rmw_handle.restype = ctypes.c_void_p
    lib.rmw_get_gid_for_publisher.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Gid)]
    lib.rcutils_get_default_allocator.restype = _Allocator
    lib.rcutils_uint8_array_init.argtypes = [ctypes.POINTER(_Bytes), ctypes.c_size_t, ctypes.POINTER(_Allocator)]
    lib.rcutils_uint8_array_fini.argtypes = [ctypes.POINTER(_Bytes)]
    lib.rcutils_get_error_string.restype = _ErrorString
    return lib


def _failed(call: str, code: int) -> RuntimeError:
    lib = _rcl()
    message = lib.rcutils_get_error_string().text.decode(errors="replace")
    lib.rcutils_reset_error()
    return RuntimeError(f"{call} failed ({code}): {message}")


def publisher_gid(publisher: Any) -> bytes:
    """runtime.publisher_gid() under rclpy: the gid rmw gives ``publisher``'s messages (an rclpy
    Publisher, or runtime.shaped()'s wrapper of one)."""
    lib, gid = _rcl(), _Gid()
    with publisher.handle:
        code = lib.rmw_get_gid_for_publisher(lib.rcl_publisher_get_rmw_handle(publisher.handle.pointer),
                                             ctypes.byref(gid))
    if code != RCL_RET_OK:
        raise _failed("rmw_get_gid_for_publisher", code)
    return bytes(gid.data)


def take_with_info(subscription: Subscription) -> tuple[Any, dict] | None:
    """The subscription's next message and its info, ``publisher_gid`` included; None if none is
    waiting. Call it holding ``subscription.handle`` (as rclpy's own take does)."""
    lib, data, info = _rcl(), _Bytes(), _MessageInfo()
    allocator = lib.rcutils_get_default_allocator()
    code = lib.rcutils_uint8_array_init(ctypes.byref(data), 0, ctypes.byref(allocator))
    if code != RCL_RET_OK:
        raise _failed("rcutils_uint8_array_init", code)
    try:
        code = lib.rcl_take_serialized_message(subscription.handle.pointer, ctypes.byref(data), ctypes.byref(info),
                                               None)
        if code == RCL_RET_SUBSCRIPTION_TAKE_FAILED:
            return None
        if code != RCL_RET_OK:
            raise _failed("rcl_take_serialized_message", code)
        serialized = ctypes.string_at(data.buffer, data.buffer_length)
    finally:
        lib.rcutils_uint8_array_fini(ctypes.byref(data))

    def number(value: int) -> int | None:
        return None if value == UNSUPPORTED else value

    return deserialize_message(serialized, subscription.msg_type), {
        "source_timestamp": info.source_timestamp, "received_timestamp": info.received_timestamp,
        "publication_sequence_number": number(info.publication_sequence_number),
        "reception_sequence_number": number(info.reception_sequence_number),
        "publisher_gid": bytes(info.publisher_gid.data)}


class TakesPublisherGids:
    """Mixed into an rclpy executor (before it): a subscription whose callback takes message info gets
    the info with ``publisher_gid`` (:func:`take_with_info`); the others are taken as rclpy takes them.
    Overrides Executor._take_subscription, rclpy Jazzy's take step (executors.py), in its shape."""

    def _take_subscription(self, sub: Subscription):
        if sub.raw or sub._callback_type is not Subscription.CallbackType.WithMessageInfo:
            return super()._take_subscription(sub)  # type: ignore[misc]
        try:
            with sub.handle:
                taken = take_with_info(sub)
        except InvalidHandle:  # destroyed meanwhile, as rclpy's take allows
            return None
        if taken is None:
            return None

        async def _execute():
            await await_or_execute(sub.callback, *taken)

        return _execute
