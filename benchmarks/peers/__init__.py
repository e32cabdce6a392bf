"""Peer systems on the same weights and prompts: transformers `generate` and Outlines."""

from __future__ import annotations

from functools import cached_property

from benchmarks.peers.hf import HFPeer
from benchmarks.peers.outlines_peer import OutlinesPeer, unavailable_reason


class Unavailable(RuntimeError):
    """A peer cannot run this workload; the message is the reason shown as "n/a"."""


class Peers:
    """The peer models, loaded on first use and shared by every workload of a run."""

    def __init__(self, model: str) -> None:
        self.model_name = model

    @cached_property
    def hf(self) -> HFPeer:
        return HFPeer(self.model_name)

    @cached_property
    def outlines(self) -> OutlinesPeer:
        reason = unavailable_reason()
        if reason is not None:
            raise Unavailable(reason)
        return OutlinesPeer(self.hf)


__all__ = ["HFPeer", "OutlinesPeer", "Peers", "Unavailable"]
