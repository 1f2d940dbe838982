"""The client's TCP stack: the window the edge sees in the handshake's last ACK, computed the way
each operating system computes it, from its receive buffer and its own MSS.

The agent logs `init_snd_wnd_bytes` as `tcp_sock.snd_wnd` at PASSIVE_ESTABLISHED, i.e. the
window field of the client's ACK that completes the handshake, shifted by the client's window
scale. Every constant below is a kernel or OS default; docs/simulator.md ("The client's first
window") gives the source of each. Nothing here depends on the access type except through the
client's own MSS (its interface MTU) and, only when `SimParams.legacy_radio_buffer_share` > 0,
Android's per-radio buffer sizes.
"""
from __future__ import annotations

import numpy as np

#: Linux `net/ipv4/tcp_output.c` tcp_select_initial_window(): the window offered is never above
#: U16_MAX before the handshake (the SYN's field is unscaled).
U16_MAX = 65535
#: Linux ≥ 4.19 (commit a337531b942b, "tcp: up initial rmem to 128KB and SYN rwin to around
#: 64KB"): tcp_rmem[1] = 131072, the window capped at U16_MAX instead of 20 segments (the
#: commit's "~29KB (20 MSS)" before it); tcp_win_from_space() keeps half of the buffer
#: (tcp_adv_win_scale = 1, and the same half from the initial scaling_ratio of 6.x kernels).
LINUX_RMEM_DEFAULT = 131072
LINUX_LEGACY_INIT_SEGS = 20
#: Android's ConnectivityService sets the receive buffer per radio from the platform's
#: `config_tcp_buffers` (tcp_rmem default: LTE, NR and Wi-Fi 1,048,576; EDGE 26,280) ...
ANDROID_RMEM_DEFAULT = 1048576
ANDROID_RMEM_DEFAULT_LEGACY_RADIO = 26280
#: ... and net.ipv4.tcp_default_init_rwnd = 60 (Android's `net.tcp.default_init_rwnd`), which
#: caps the first window at 60 segments on kernels that carry that sysctl (before GKI).
ANDROID_INIT_RWND_SEGS = 60
#: Window scale: ilog2(max(tcp_rmem[2], rmem_max)) - 15 (tcp_select_initial_window): tcp_rmem[2]
#: 6 MiB on Linux (scale 7), Android's LTE/Wi-Fi tcp_rmem max 2 MiB (scale 6).
LINUX_WSCALE = 7
ANDROID_WSCALE = 6
#: XNU (iOS): tcp_recvspace = 128 KiB, announced whole at window scale 6 once established.
IOS_WINDOW = 131072
IOS_WSCALE = 6
#: Windows 10/11: the SYN's window is 64,240 (44 × 1460) whatever the MSS, window scale 8.
WINDOWS_WINDOW = 64240
WINDOWS_WSCALE = 8

# stack ids
ANDROID, ANDROID_LEGACY_KERNEL, IOS, WINDOWS = 0, 1, 2, 3


def _rounddown(space: np.ndarray, mss: np.ndarray) -> np.ndarray:
    """`if (space > mss) space = rounddown(space, mss)` (tcp_select_initial_window)."""
    return np.where(space > mss, space // mss * mss, space)


def _align(window: np.ndarray, wscale: int) -> np.ndarray:
    """__tcp_select_window() with a window scale: the offered window is rounded up to a multiple
    of 1 << wscale, so that the shifted field carries it whole."""
    unit = 1 << wscale
    return (window + unit - 1) // unit * unit


def linux_rcv_wnd(rmem_default: np.ndarray, mss: np.ndarray, init_rwnd_segs: int | None,
                  modern: np.ndarray) -> np.ndarray:
    """tcp_select_initial_window() for an active open. `mss` is the client's own advmss (its
    interface MTU - 40, - 60 on IPv6: no timestamp has been seen yet when connect() runs).
    Kernels ≥ 4.19 cap the window at U16_MAX; older ones take the whole space, capped by
    init_rwnd segments where the sysctl is set (Android) and by 20 segments where not."""
    space = _rounddown(rmem_default // 2, mss)
    modern_wnd = np.minimum(space, U16_MAX)
    legacy_segs = init_rwnd_segs if init_rwnd_segs is not None else LINUX_LEGACY_INIT_SEGS
    legacy_wnd = np.minimum(space, legacy_segs * mss)
    wnd = np.where(modern, modern_wnd, legacy_wnd)
    if init_rwnd_segs is not None:
        wnd = np.minimum(wnd, init_rwnd_segs * mss)
    return wnd


def established_window(stack: np.ndarray, client_mss: np.ndarray, legacy_radio: np.ndarray) -> np.ndarray:
    """The window (bytes) of the client's handshake-completing ACK, as the server's snd_wnd.

    stack: ANDROID (kernel ≥ 4.19), ANDROID_LEGACY_KERNEL (< 4.19), IOS or WINDOWS per connection;
    client_mss: the client's own MSS; legacy_radio: Android on 2G/3G-sized buffers (only where
    the simulator's `legacy_radio_buffer_share` knob puts any)."""
    android = (stack == ANDROID) | (stack == ANDROID_LEGACY_KERNEL)
    rmem = np.where(legacy_radio, ANDROID_RMEM_DEFAULT_LEGACY_RADIO, ANDROID_RMEM_DEFAULT)
    android_wnd = _align(linux_rcv_wnd(rmem, client_mss, ANDROID_INIT_RWND_SEGS, stack == ANDROID), ANDROID_WSCALE)
    return np.where(android, android_wnd,
                    np.where(stack == IOS, _align(np.full(len(stack), IOS_WINDOW), IOS_WSCALE),
                             _align(np.full(len(stack), WINDOWS_WINDOW), WINDOWS_WSCALE))).astype(np.int64)
