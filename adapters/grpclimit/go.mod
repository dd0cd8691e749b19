module github.com/sluicehq/sluice/adapters/grpclimit

go 1.25.0

require (
	github.com/redis/go-redis/v9 v9.22.0
	github.com/sluicehq/sluice v0.0.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800
	google.golang.org/grpc v1.84.0
	google.golang.org/protobuf v1.36.11
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
)

replace github.com/sluicehq/sluice => ../..
