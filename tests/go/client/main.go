// A Go client of the guestagent contract, built from protos/ alone: what a runtime author in
// Go (Kata's runtime, a containerd shim) would write. tests/vm/test_go_client.py builds it
// with tests/go/build.sh and runs it against the agent in a test guest.
//
// Usage: client HOST:PORT CGROUP
//
// It prints one line per step and exits non-zero on the first step that does not go as the
// contract says. Before the watch stream's cgroup is removed it prints "REMOVE <cgroup>" and
// waits for a line on stdin: whoever runs it removes the cgroup in the guest, as a container
// exit would.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	pb "github.com/guestagent/guestagent/gen/go/guestagent/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

const mib = 1 << 20

func fail(format string, args ...interface{}) {
	fmt.Printf("FAIL "+format+"\n", args...)
	os.Exit(1)
}

// refusal is what a runtime decides on: the code, and ErrorInfo.reason, never the message.
type refusal struct {
	code   codes.Code
	reason string
	domain string
	meta   map[string]string
	fields []string
}

func refusalOf(err error) refusal {
	st, _ := status.FromError(err)
	r := refusal{code: st.Code()}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			r.reason, r.domain, r.meta = d.Reason, d.Domain, d.Metadata
		case *errdetails.BadRequest:
			for _, v := range d.FieldViolations {
				r.fields = append(r.fields, v.Field)
			}
		}
	}
	return r
}

func expectRefusal(step string, err error, code codes.Code, reason string) refusal {
	if err == nil {
		fail("%s: answered, expected %s %s", step, code, reason)
	}
	r := refusalOf(err)
	if r.code != code || r.reason != reason || r.domain != "guestagent" {
		fail("%s: %s %q (domain %q), expected %s %s: %v", step, r.code, r.reason, r.domain,
			code, reason, err)
	}
	keys := make([]string, 0, len(r.meta))
	for key := range r.meta {
		keys = append(keys, key+"="+r.meta[key])
	}
	sort.Strings(keys)
	fmt.Printf("%s: refused %s reason=%s fields=%v metadata=%v\n", step, r.code, r.reason,
		r.fields, keys)
	return r
}

func call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Minute) // A TCG guest is slow.
}

func main() {
	if len(os.Args) != 3 {
		fail("usage: client HOST:PORT CGROUP")
	}
	target, cgroup := os.Args[1], os.Args[2]
	// The contract's guidance for long streams: ping every 30 s, 10 s to answer, also idle.
	// grpc.WithInsecure: Debian 12's grpc-go (1.33) predates credentials/insecure.
	conn, err := grpc.Dial(target, grpc.WithInsecure(), grpc.WithKeepaliveParams(
		keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			PermitWithoutStream: true}))
	if err != nil {
		fail("dial %s: %v", target, err)
	}
	defer conn.Close()
	agent := pb.NewMemoryAgentClient(conn)

	// Once per connection: what this agent is and can do.
	ctx, cancel := call()
	info, err := agent.GetAgentInfo(ctx, &pb.GetAgentInfoRequest{})
	cancel()
	if err != nil {
		fail("GetAgentInfo: %v", err)
	}
	var features []string
	for _, f := range info.Features {
		if f.Present {
			features = append(features, f.Name)
		} else {
			features = append(features, "-"+f.Name)
		}
	}
	fmt.Printf("GetAgentInfo: version=%s contract_revision=%d features=%s\n", info.Version,
		info.ContractRevision, strings.Join(features, ","))
	if info.ContractRevision < 2 {
		fail("contract revision %d: removed cgroups end the stream there", info.ContractRevision)
	}

	ctx, cancel = call()
	report, err := agent.GetMemoryInfo(ctx, &pb.GetMemoryInfoRequest{})
	cancel()
	if err != nil {
		fail("GetMemoryInfo: %v", err)
	}
	fmt.Printf("GetMemoryInfo: mem_total=%d MiB mem_available=%d MiB absent=%d\n",
		report.System.MemTotalBytes/mib, report.System.MemAvailableBytes/mib, len(report.Absent))
	if report.System.MemTotalBytes == 0 {
		fail("GetMemoryInfo: MemTotal 0")
	}

	// Refusals, read by reason.
	ctx, cancel = call()
	_, err = agent.GetMemoryInfo(ctx, &pb.GetMemoryInfoRequest{Cgroups: []string{cgroup + "/nosuch"}})
	cancel()
	expectRefusal("GetMemoryInfo(missing cgroup)", err, codes.NotFound, "CGROUP_NOT_FOUND")
	limit, swap := int64(64*mib), int64(32*mib)
	ctx, cancel = call()
	_, err = agent.SetMemoryLimits(ctx, &pb.SetMemoryLimitsRequest{Cgroup: cgroup,
		Memory: &pb.LinuxMemory{Limit: &limit, Swap: &swap}, Create: true})
	cancel()
	r := expectRefusal("SetMemoryLimits(swap below limit)", err, codes.InvalidArgument,
		"SWAP_TOTAL_BELOW_LIMIT")
	if len(r.fields) != 1 || r.fields[0] != "memory.swap" {
		fail("SetMemoryLimits(swap below limit): field violations %v", r.fields)
	}

	setLimit := func(step string) {
		ctx, cancel := call()
		defer cancel()
		applied, err := agent.SetMemoryLimits(ctx, &pb.SetMemoryLimitsRequest{Cgroup: cgroup,
			Memory: &pb.LinuxMemory{Limit: &limit}, Create: true})
		if err != nil {
			fail("%s: %v", step, err)
		}
		fmt.Printf("%s: memory_max=%s created=%v\n", step, applied.MemoryMax, applied.Created)
		if applied.MemoryMax != fmt.Sprint(limit) {
			fail("%s: memory.max reads %s", step, applied.MemoryMax)
		}
	}
	setLimit("SetMemoryLimits")

	// A stream for the life of a pod: it outlives its container's cgroup.
	streamCtx, stop := context.WithCancel(context.Background())
	defer stop()
	stream, err := agent.WatchMemory(streamCtx, &pb.WatchMemoryRequest{
		Cgroups: []string{cgroup}, IntervalMs: 500})
	if err != nil {
		fail("WatchMemory: %v", err)
	}
	next := func(step string) *pb.MemoryInfo {
		message, err := stream.Recv()
		if err != nil {
			fail("WatchMemory %s: the stream ended: %v", step, err)
		}
		return message
	}
	first := next("initial")
	if first.Reason != pb.WatchReason_WATCH_REASON_INITIAL || len(first.Cgroups) != 1 {
		fail("WatchMemory: first message %s with %d cgroups", first.Reason, len(first.Cgroups))
	}
	fmt.Printf("WatchMemory: %s %s current=%d\n", first.Reason, first.Cgroups[0].Path,
		first.Cgroups[0].CurrentBytes)

	fmt.Printf("REMOVE %s\n", cgroup)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail("waiting for the cgroup's removal: %v", err)
	}
	for {
		message := next("after the removal")
		if len(message.RemovedCgroups) == 1 && message.RemovedCgroups[0] == cgroup &&
			len(message.Cgroups) == 0 {
			fmt.Printf("WatchMemory: %s removed_cgroups=%v, the stream goes on\n",
				message.Reason, message.RemovedCgroups)
			break
		}
	}

	setLimit("SetMemoryLimits(again)") // The cgroup, created again under its name.
	// A report read while the call ran may show the cgroup made and its limit not yet written
	// (max 0: none); the stream shows it back once a report has the limit.
	for {
		message := next("after the cgroup came back")
		if len(message.RemovedCgroups) == 0 && len(message.Cgroups) == 1 &&
			message.Cgroups[0].Max.GetBytes() == uint64(limit) {
			fmt.Printf("WatchMemory: %s %s is back, max=%d\n", message.Reason,
				message.Cgroups[0].Path, message.Cgroups[0].Max.Bytes)
			break
		}
	}
	stop()
	fmt.Println("OK")
}
