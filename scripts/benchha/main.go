// Command benchha writes ConfigMaps to a kelp apiserver and says how fast,
// for scripts/bench-ha.sh, which runs it inside a node's network namespace.
//
//	benchha write -kubeconfig K [-server URL] -n 1000 [-writers 8] [-size 1024] -prefix P
//	benchha count -kubeconfig K -prefix P
//	benchha outage -kubeconfig K -servers URL,URL
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
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
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
		fmt.Fprintln(os.Stderr, "usage: benchha write|count|outage [flags]")
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
	default:
		err = fmt.Errorf("unknown command %q: want write, count or outage", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchha:", err)
		os.Exit(1)
	}
}

// client is a clientset from kubeconfig, for server if it is set, with no
// client-side rate limit: the point is to see the server's.
func client(kubeconfig, server string, timeout time.Duration) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags(server, kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = timeout
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " benchha"
	return kubernetes.NewForConfig(cfg)
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
