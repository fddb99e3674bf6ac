"""A Python service calling typesafe over binary gRPC with code generated from proto/.

It knows nothing of the service but the generated stubs: it calls Decide, Search
and ListSources, then provokes a 400 and a 401 and reads each error from the
google.rpc.Status in `grpc-status-details-bin` (our ErrorDetail, RetryInfo,
BadRequest), never from the message text. With TYPESAFE_BROKE_KEY (an account
without credits) it provokes a 402; with TYPESAFE_LIMITED_KEY it makes 61 calls
to meet the rate limit (429). It prints one JSON object of what it saw.

Usage: bash examples/python/generate.sh
       TYPESAFE_URL=http://127.0.0.1:8080 TYPESAFE_KEY=ts_live_... python3 examples/python/client.py [GENERATED_DIR]
"""

import json
import os
import sys
from urllib.parse import urlparse

target = urlparse(os.environ.get("TYPESAFE_URL", "http://127.0.0.1:8080")).netloc
generated = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")
sys.path.insert(0, generated)

import grpc  # noqa: E402
from google.protobuf import struct_pb2  # noqa: E402
from google.rpc import error_details_pb2, status_pb2  # noqa: E402
from typesafe.decision.v1 import decision_service_pb2 as decision  # noqa: E402
from typesafe.decision.v1 import decision_service_pb2_grpc as decision_grpc  # noqa: E402
from typesafe.error.v1 import error_pb2  # noqa: E402
from typesafe.search.v1 import search_service_pb2 as search  # noqa: E402
from typesafe.search.v1 import search_service_pb2_grpc as search_grpc  # noqa: E402


def bearer(key):
    return [("authorization", f"Bearer {key}")]


def decide_request(model="typesafe/service-1.13"):
    criteria = struct_pb2.Value()
    criteria.list_value.extend(["none", "low", "high"])
    return decision.DecideRequest(
        model=model,
        state=struct_pb2.Value(string_value="I was charged twice for my pro plan"),
        questions={
            "urgent": decision.Question(type="noul", instructions="Is it urgent?"),
            "impact": decision.Question(type="score", instructions="How big is the impact?", criteria=criteria),
        },
    )


def error_of(err: grpc.RpcError):
    """The typed error: status code name plus every detail, decoded from the binary trailer."""
    trailer = dict(err.trailing_metadata() or ())
    status = status_pb2.Status.FromString(trailer["grpc-status-details-bin"])
    seen = {"code": err.code().name, "status_code": status.code}
    for any_detail in status.details:
        if any_detail.Is(error_pb2.ErrorDetail.DESCRIPTOR):
            detail = error_pb2.ErrorDetail()
            any_detail.Unpack(detail)
            seen["reason"] = detail.reason
            seen["field"] = detail.field
            seen["request_id"] = detail.request_id
            seen["metadata"] = dict(detail.metadata)
        elif any_detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            any_detail.Unpack(retry)
            seen["retry_delay_seconds"] = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
        elif any_detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_detail.Unpack(bad)
            seen["field_violations"] = [v.field for v in bad.field_violations]
    return seen


def expect_error(call):
    try:
        call()
    except grpc.RpcError as err:
        return error_of(err)
    raise AssertionError("the call succeeded where an error was expected")


with grpc.insecure_channel(target) as channel:
    decisions = decision_grpc.DecisionServiceStub(channel)
    searches = search_grpc.SearchServiceStub(channel)
    key = os.environ["TYPESAFE_KEY"]
    report = {}

    answer = decisions.Decide(decide_request(), metadata=bearer(key), timeout=20)
    report["decide"] = {
        "urgent_type": answer.answers["urgent"].type,
        "urgent_noul": answer.answers["urgent"].noul,
        "impact_label": answer.answers["impact"].x_label,
        "charged_credits": answer.billing.charged_credits,
        "model": answer.model,
    }

    found = searches.Search(search.SearchRequest(q="rust async runtime", s=["hackernews"]), metadata=bearer(key), timeout=20)
    report["search"] = {
        "results": len(found.results),
        "first_url": found.results[0].url if found.results else "",
        "sources": {source.id: source.status for source in found.sources},
    }

    listed = searches.ListSources(search.ListSourcesRequest(), metadata=bearer(key), timeout=20)
    report["sources"] = sorted(source.id for source in listed.sources)

    report["invalid"] = expect_error(lambda: decisions.Decide(decide_request(model="other"), metadata=bearer(key), timeout=20))
    report["unauthenticated"] = expect_error(lambda: decisions.Decide(decide_request(), metadata=bearer("ts_not_a_key"), timeout=20))
    broke_key = os.environ.get("TYPESAFE_BROKE_KEY")
    if broke_key:
        report["insufficient"] = expect_error(lambda: decisions.Decide(decide_request(), metadata=bearer(broke_key), timeout=20))

    # 60 calls a minute per account: the 61st is refused with a retry delay.
    limited_key = os.environ.get("TYPESAFE_LIMITED_KEY")
    if limited_key:
        for _ in range(60):
            decisions.Decide(decide_request(), metadata=bearer(limited_key), timeout=20)
        report["rate_limited"] = expect_error(lambda: decisions.Decide(decide_request(), metadata=bearer(limited_key), timeout=20))

print(json.dumps(report))
