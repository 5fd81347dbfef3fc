"""The gateway bench's instant rate-limit service answers every ShouldRateLimit OK, one
status per descriptor, on the router's lean HTTP/2 listener, and serves gRPC health;
bench.cpu tells its process from the cluster's."""

from __future__ import annotations

import os

import grpc  # type: ignore[import-untyped]
import pytest
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from bench.cpu import below, process_table, role_of
from bench.instant_rls import instant_service

pytestmark = pytest.mark.timeout(60)

OK = rls_pb2.RateLimitResponse.Code.OK


def request(descriptors: int) -> object:
    ask = rls_pb2.RateLimitRequest(domain="bench")
    for index in range(descriptors):
        ask.descriptors.add().entries.add(key="user", value=str(index))
    return ask


def test_it_answers_ok_for_each_descriptor_and_serves_health() -> None:
    with instant_service() as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        limiter = rls_pb2_grpc.RateLimitServiceStub(channel)
        for descriptors in (1, 3, 1):
            answer = limiter.ShouldRateLimit(request(descriptors), timeout=5)
            assert answer.overall_code == OK
            assert [status.code for status in answer.statuses] == [OK] * descriptors
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Nope")(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        roles = [role_of(pid) for pid in below(os.getpid(), process_table())]
        assert roles.count("instant service") == 1, roles
