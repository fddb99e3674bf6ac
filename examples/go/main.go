// A Go service calling typesafe over binary gRPC with code generated from proto/
// by protoc-gen-go and protoc-gen-go-grpc. It calls ListSources and Decide, then
// reads a 400 from the status details alone (our ErrorDetail and google.rpc
// BadRequest), and prints one JSON object of what it saw.
//
// Usage: bash examples/go/build.sh, then
// TYPESAFE_URL=http://127.0.0.1:8080 TYPESAFE_KEY=ts_live_... examples/go/.build/client
package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	decisionv1 "typesafeclient/gen/typesafe/decision/v1"
	errorv1 "typesafeclient/gen/typesafe/error/v1"
	searchv1 "typesafeclient/gen/typesafe/search/v1"
)

func main() {
	address := "http://127.0.0.1:8080"
	if value := os.Getenv("TYPESAFE_URL"); value != "" {
		address = value
	}
	service, err := url.Parse(address)
	must(err)
	// gRPC over HTTP/2 without TLS (prior knowledge), as the service listens.
	conn, err := grpc.Dial(service.Host, grpc.WithInsecure())
	must(err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+os.Getenv("TYPESAFE_KEY"))

	report := map[string]any{}
	sources, err := searchv1.NewSearchServiceClient(conn).ListSources(ctx, &searchv1.ListSourcesRequest{})
	must(err)
	ids := []string{}
	for _, source := range sources.Sources {
		ids = append(ids, source.Id)
	}
	report["sources"] = ids

	decisions := decisionv1.NewDecisionServiceClient(conn)
	request := &decisionv1.DecideRequest{
		Model:     "typesafe/service-1.13",
		State:     structpb.NewStringValue("I was charged twice for my pro plan"),
		Questions: map[string]*decisionv1.Question{"urgent": {Type: "noul", Instructions: "Is it urgent?"}},
	}
	answer, err := decisions.Decide(ctx, request)
	must(err)
	report["urgent_noul"] = answer.Answers["urgent"].GetNoul()

	request.Model = "other"
	_, err = decisions.Decide(ctx, request)
	invalid := map[string]any{"code": status.Code(err).String()}
	for _, detail := range status.Convert(err).Details() {
		switch d := detail.(type) {
		case *errorv1.ErrorDetail:
			invalid["reason"], invalid["field"] = d.Reason, d.Field
		case *errdetails.BadRequest:
			invalid["field_violation"] = d.FieldViolations[0].Field
		}
	}
	report["invalid"] = invalid
	must(json.NewEncoder(os.Stdout).Encode(report))
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
