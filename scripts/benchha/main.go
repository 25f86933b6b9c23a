// Command benchha writes and reads ConfigMaps of a kelp apiserver and says
// how fast, for scripts/bench-ha.sh and scripts/bench-scale.sh, which run it
// inside a node's network namespace.
//
//	benchha write -kubeconfig K [-server URL] -n 1000 [-writers 8] [-size 1024] -prefix P
//	benchha count -kubeconfig K -prefix P
//	benchha outage -kubeconfig K -servers URL,URL
//	benchha list -kubeconfig K [-n 20] [-limit 500] [-gets 200]
//
// write creates n ConfigMaps named P-<i> in the default namespace, each with
// size bytes of data, from writers goroutines that take the next one as they
// finish the last, and prints one line of key=value figures: the objects per
// second over the whole run and the 50th and 99th percentile of the latency
// of one create. Any failed create ends it with an error.
//
// count prints how many ConfigMaps of the default namespace are named P-….
//
// outage writes to each of servers (one writer each, at most one create per
// 10 ms) until SIGTERM or SIGINT and prints "ack UNIX_MS SERVER_INDEX" for
// each acknowledged create; a create that fails or takes longer than 2 s is
// given up (its error goes to stderr) and the next one follows.
//
// list times reads of the default namespace's ConfigMaps, one after another,
// n times each kind, the kinds taking turns, and prints one line of
// key=value figures, the 50th and 99th percentile of each kind: paged, the
// whole list in pages of limit objects through continue tokens, as kubectl
// lists (one figure per whole list); quorum, one unpaginated
// LIST with resourceVersion "" (a consistent read); cache, one with
// resourceVersion "0" (whatever the apiserver's watch cache holds); and get,
// gets GETs of one ConfigMap (resourceVersion "", which the apiserver always
// passes to the datastore); and how many of the LISTs the apiserver
// answered from its watch cache (cache_lists) and how many it passed to the
// datastore (storage_lists), by its metrics. Which ones it answers from its
// watch cache and which from the datastore is its choice: since Kubernetes
// 1.34 it serves consistent reads and continue tokens from the cache too,
// unless the cache of ConfigMaps is off (--watch-cache-sizes=configmaps#0).
// It speaks protobuf, as kelp's and Kubernetes' own components do, so the
// figures are more the datastore's and less JSON's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const namespace = "default"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchha write|count|outage|list [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "write":
		err = write(args)
	case "count":
		err = count(args)
	case "outage":
		err = outage(args)
	case "list":
		err = list(args)
	default:
		err = fmt.Errorf("unknown command %q: want write, count, outage or list", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchha:", err)
		os.Exit(1)
	}
}

// client is a clientset from kubeconfig, for server if it is set, with no
// client-side rate limit: the point is to see the server's.
func client(kubeconfig, server string, timeout time.Duration) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig, server, timeout)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func restConfig(kubeconfig, server string, timeout time.Duration) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags(server, kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = timeout
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " benchha"
	return cfg, nil
}

func configMap(name string, size int) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"payload": strings.Repeat("x", size)},
	}
}

func write(args []string) error {
	fs := flag.NewFlagSet("write", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	server := fs.String("server", "", "apiserver URL instead of the kubeconfig's")
	n := fs.Int("n", 1000, "ConfigMaps to create")
	writers := fs.Int("writers", 1, "concurrent writers")
	size := fs.Int("size", 1024, "bytes of data in each ConfigMap")
	prefix := fs.String("prefix", "bench", "name prefix")
	_ = fs.Parse(args)
	if *n < 1 || *writers < 1 || *size < 0 {
		return errors.New("write: -n and -writers must be positive, -size not negative")
	}
	c, err := client(*kubeconfig, *server, 30*time.Second)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	latencies := make([]time.Duration, *n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, *writers)
	start := time.Now()
	for range *writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= *n || ctx.Err() != nil {
					return
				}
				cm := configMap(fmt.Sprintf("%s-%d", *prefix, i), *size)
				t := time.Now()
				if _, err := c.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create ConfigMap %s: %w", cm.Name, err)
					cancel()
					return
				}
				latencies[i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	slices.Sort(latencies)
	fmt.Printf("objects=%d writers=%d seconds=%.2f rate=%.1f p50_ms=%.2f p99_ms=%.2f\n",
		*n, *writers, elapsed.Seconds(), float64(*n)/elapsed.Seconds(),
		ms(percentile(latencies, 50)), ms(percentile(latencies, 99)))
	return nil
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100
	return sorted[max(rank, 1)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func count(args []string) error {
	fs := flag.NewFlagSet("count", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	prefix := fs.String("prefix", "bench", "name prefix")
	_ = fs.Parse(args)
	c, err := client(*kubeconfig, "", 60*time.Second)
	if err != nil {
		return err
	}
	total, opts := 0, metav1.ListOptions{Limit: 1000}
	for {
		list, err := c.CoreV1().ConfigMaps(namespace).List(context.Background(), opts)
		if err != nil {
			return fmt.Errorf("list ConfigMaps: %w", err)
		}
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, *prefix+"-") {
				total++
			}
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	fmt.Println(total)
	return nil
}

func outage(args []string) error {
	fs := flag.NewFlagSet("outage", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	servers := fs.String("servers", "", "comma-separated apiserver URLs, one writer each")
	_ = fs.Parse(args)
	urls := strings.Split(*servers, ",")
	if *servers == "" {
		return errors.New("outage: -servers is empty")
	}
	clients := make([]kubernetes.Interface, len(urls))
	for i, u := range urls {
		c, err := client(*kubeconfig, u, 2*time.Second)
		if err != nil {
			return err
		}
		clients[i] = c
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var mu sync.Mutex // one line at a time on stdout
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for seq := 0; ctx.Err() == nil; seq++ {
				cm := configMap(fmt.Sprintf("outage-%d-%d", i, seq), 64)
				_, err := c.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
				now := time.Now().UnixMilli()
				mu.Lock()
				if err == nil {
					fmt.Printf("ack %d %d\n", now, i)
				} else if ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "%d server %d: %v\n", now, i, err)
				}
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func list(args []string) error {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	n := fs.Int("n", 20, "LISTs of each kind")
	limit := fs.Int64("limit", 500, "objects per page of the paged LISTs")
	gets := fs.Int("gets", 200, "GETs of one ConfigMap")
	_ = fs.Parse(args)
	if *n < 1 || *limit < 1 || *gets < 1 {
		return errors.New("list: -n, -limit and -gets must be positive")
	}
	cfg, err := restConfig(*kubeconfig, "", 5*time.Minute)
	if err != nil {
		return err
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c := cs.CoreV1().ConfigMaps(namespace)
	ctx := context.Background()

	first, err := c.List(ctx, metav1.ListOptions{ResourceVersion: "0", Limit: 1})
	if err != nil {
		return fmt.Errorf("list ConfigMaps: %w", err)
	}
	if len(first.Items) == 0 {
		return errors.New("list: the default namespace has no ConfigMaps: write some first")
	}
	name := first.Items[0].Name
	cacheBefore, storageBefore, err := listCounts(ctx, cs)
	if err != nil {
		return err
	}

	// Each kind returns how many ConfigMaps it read, which must agree: a
	// LIST that returned less would look fast.
	kinds := []struct {
		name string
		read func() (int, error)
	}{
		{"paged", func() (int, error) {
			total, opts := 0, metav1.ListOptions{Limit: *limit}
			for {
				l, err := c.List(ctx, opts)
				if err != nil {
					return 0, err
				}
				total += len(l.Items)
				if l.Continue == "" {
					return total, nil
				}
				opts.Continue = l.Continue
			}
		}},
		{"quorum", func() (int, error) {
			l, err := c.List(ctx, metav1.ListOptions{})
			if err != nil {
				return 0, err
			}
			return len(l.Items), nil
		}},
		{"cache", func() (int, error) {
			l, err := c.List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				return 0, err
			}
			return len(l.Items), nil
		}},
	}
	latencies := make([][]time.Duration, len(kinds))
	objects := make([]int, len(kinds))
	for range *n {
		for k, kind := range kinds {
			t := time.Now()
			got, err := kind.read()
			if err != nil {
				return fmt.Errorf("%s LIST of ConfigMaps: %w", kind.name, err)
			}
			latencies[k] = append(latencies[k], time.Since(t))
			objects[k] = max(objects[k], got)
		}
	}
	getLatencies := make([]time.Duration, *gets)
	for i := range getLatencies {
		t := time.Now()
		if _, err := c.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("get ConfigMap %s: %w", name, err)
		}
		getLatencies[i] = time.Since(t)
	}

	cacheAfter, storageAfter, err := listCounts(ctx, cs)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("objects=%d n=%d limit=%d cache_lists=%.0f storage_lists=%.0f", objects[1], *n, *limit,
		cacheAfter-cacheBefore, storageAfter-storageBefore)
	for k, kind := range kinds {
		if objects[k] != objects[1] {
			return fmt.Errorf("list: a %s LIST returned %d ConfigMaps, a quorum one %d: were ConfigMaps written meanwhile?", kind.name, objects[k], objects[1])
		}
		slices.Sort(latencies[k])
		line += fmt.Sprintf(" %s_p50_ms=%.2f %s_p99_ms=%.2f", kind.name, ms(percentile(latencies[k], 50)), kind.name, ms(percentile(latencies[k], 99)))
	}
	slices.Sort(getLatencies)
	fmt.Printf("%s gets=%d get_p50_ms=%.2f get_p99_ms=%.2f\n", line, *gets, ms(percentile(getLatencies, 50)), ms(percentile(getLatencies, 99)))
	return nil
}

// listCounts reads the apiserver's counts of ConfigMap LISTs it answered from
// its watch cache and of those it passed to the datastore, so that a figure
// says which one it measured.
func listCounts(ctx context.Context, cs kubernetes.Interface) (cache, storage float64, err error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read the apiserver's metrics: %w", err)
	}
	for line := range strings.Lines(string(raw)) {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.Contains(rest, `"configmaps"`) && !strings.Contains(rest, `"/configmaps"`) {
			continue
		}
		var total *float64
		switch name {
		case "apiserver_cache_list_total":
			total = &cache
		case "apiserver_storage_list_total":
			total = &storage
		default:
			continue
		}
		fields := strings.Fields(rest)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parse metric line %q: %w", strings.TrimSpace(line), err)
		}
		*total += v
	}
	return cache, storage, nil
}
