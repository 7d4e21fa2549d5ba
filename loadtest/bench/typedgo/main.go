// typedgo: a client-go typed client, set up as kube's components set theirs up, listing and watching
// pods through one target; it prints one JSON line of what it cost the client.
//
// Built from the kube-reference kit's vendored tree (no network): see loadtest/bench/typed_go.py.
// The rest.Config is the components': ContentType protobuf and no AcceptContentTypes, so client-go
// sends "Accept: application/vnd.kubernetes.protobuf, */*" and decodes whatever the server chose.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type counted struct {
	rt          http.RoundTripper
	bytes       atomic.Int64
	contentType atomic.Value
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (c *counted) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil {
		c.contentType.Store(resp.Header.Get("Content-Type"))
		resp.Body = countingBody{resp.Body, &c.bytes}
	}
	return resp, err
}

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type phase struct {
	Objects     int     `json:"objects"`
	Bytes       int64   `json:"bytes"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	WallSeconds float64 `json:"wall_seconds"`
	ContentType string  `json:"content_type"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the target")
	server := flag.String("server", "", "override the kubeconfig's server (the proxy)")
	namespace := flag.String("namespace", "", "namespace of the pods")
	rounds := flag.Int("rounds", 5, "full paginated LISTs")
	limit := flag.Int64("limit", 500, "page size")
	watches := flag.Int("watches", 5, "watches from resourceVersion=0, each read until its initial ADDED events came")
	expect := flag.Int("expect", 0, "the pods in the namespace (a watch's initial events)")
	jsonClient := flag.Bool("json", false, "ContentType application/json instead (what such a client got from the proxy before)")
	ca := flag.String("ca", "", "the target's CA file instead of the kubeconfig's (the proxy's own certificate)")
	flag.Parse()

	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: *kubeconfig}
	overrides := &clientcmd.ConfigOverrides{}
	if *server != "" {
		overrides.ClusterInfo.Server = *server
	}
	config, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *ca != "" {
		config.TLSClientConfig.CAData, config.TLSClientConfig.CAFile = nil, *ca
	}
	// As component-base's ClientConnectionConfiguration defaults (kube-controller-manager, kube-scheduler).
	config.ContentType = "application/vnd.kubernetes.protobuf"
	if *jsonClient {
		config.ContentType = "application/json"
	}
	config.QPS, config.Burst = 1000, 1000
	counter := &counted{}
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter })
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	pods := client.CoreV1().Pods(*namespace)

	// One warm-up LIST (connection, TLS, discovery-free): not measured.
	if _, err := pods.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		fmt.Fprintln(os.Stderr, "warm-up:", err)
		os.Exit(1)
	}
	measure := func(run func() (int, error)) phase {
		counter.bytes.Store(0)
		c0, t0 := cpu(), time.Now()
		n, err := run()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ct, _ := counter.contentType.Load().(string)
		return phase{n, counter.bytes.Load(), (cpu() - c0).Seconds(), time.Since(t0).Seconds(), ct}
	}
	list := measure(func() (int, error) {
		total := 0
		for r := 0; r < *rounds; r++ {
			opts := metav1.ListOptions{Limit: *limit, ResourceVersion: "0"}
			for {
				page, err := pods.List(ctx, opts)
				if err != nil {
					return 0, err
				}
				total += len(page.Items)
				if page.Continue == "" {
					break
				}
				opts = metav1.ListOptions{Limit: *limit, Continue: page.Continue}
			}
		}
		return total, nil
	})
	watched := measure(func() (int, error) {
		total := 0
		for r := 0; r < *watches; r++ {
			w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: "0", TimeoutSeconds: ptr(int64(60))})
			if err != nil {
				return 0, err
			}
			n := 0
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					w.Stop()
					return 0, fmt.Errorf("watch error: %v", ev.Object)
				}
				if ev.Type == watch.Added {
					n++
				}
				if n == *expect {
					break
				}
			}
			w.Stop()
			total += n
		}
		return total, nil
	})
	out, _ := json.Marshal(map[string]phase{"list": list, "watch": watched})
	fmt.Println(string(out))
}

func ptr[T any](v T) *T { return &v }
