/* directives: tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism
 * (Korthikanti et al. 2022) as a rewrite of the IR.
 *
 * The directive. {"op": "tensor_parallel", "filter": F, "degree": t, "sequence_parallel": b}
 * divides every compute node F matches over t devices of its own device group. It adds no
 * devices: `place` (and `replicate` / `shard`) give a stage its whole group of t x d devices,
 * and tensor_parallel says that t of them share each layer. It composes with place, replicate,
 * shard and every schedule, because a schedule's split / order directives only see nodes, and
 * nodes keep their tags. It is applied after replicate / shard (phase 4b).
 *
 * Two-dimensional device groups. A TP node's group of t x d devices is read in Megatron's rank
 * order, TP innermost: position p in the group has tp_rank = p mod t and dp_rank = p div t, so
 * a `place` over consecutive device ids keeps each TP group inside a node. The node then carries
 * tp_degree = t, and its replica_degree (data parallelism) or shard_degree (expert parallelism)
 * becomes d. No new groups are made: a communicator (struct plan_comm) gains a `split` = t that
 * says which positions of its group form one instance:
 *   - purpose tp: positions [p - p mod t, p - p mod t + t), the TP peers of the device;
 *   - purpose dp / ep with split t: positions with the same TP rank, {p mod t + k t}.
 * So the gradient collectives of replicate run over the d devices that hold the same slices,
 * and the expert all-to-all too.
 *
 * Experts: EP over DP with TP inside (Megatron's expert tensor parallelism equal to TP): the
 * experts are divided over the d data-parallel positions as `shard` does today, and every
 * expert's FFN is column / row divided over the t TP peers, like the dense MLP.
 *
 * What a device holds and runs (ir/tensor_parallel.c, ir_tp_op_share): column-parallel Q/K/V
 * and MLP up/gate, row-parallel attention output and MLP down: FLOPs, bytes, parameters and
 * saved activations of attention (MLA: its projections and core), MLP, shared expert and expert
 * FFN divided by t; heads and KV heads divided (an error names the file, the directive and the
 * numbers when t does not divide heads, KV heads, FFN sizes, vocabulary or, under SP, the
 * tokens); vocabulary-parallel embedding and LM head with a parallel cross-entropy (logits never
 * gathered: two all-reduces of [T] fp32 statistics plus one of the target logits); router
 * replicated; RMSNorm and residual adds replicated unless sequence_parallel, which divides them,
 * their saved inputs and the activations between layers (and sent between stages) by t.
 *
 * Communication, inserted as IR nodes with purpose tp on the node's own stream (Megatron's TP
 * collectives are synchronous with compute): per layer, an all-reduce of [T, hidden] after each
 * row-parallel block in forward (attention, FFN) and one before each column-parallel block in
 * backward (the input gradient of attention and FFN). A segment of L layers has 2L of them per
 * pass; they are modelled as ONE node per compute node, carrying the total bytes and the count
 * of collectives (node.collectives), so the simulator charges count latencies and the total
 * transfer (the compute between them is in the compute node). With sequence_parallel each
 * all-reduce becomes a reduce-scatter and an all-gather (two nodes, same total bytes as a ring
 * all-reduce moves). The vocabulary-parallel embedding adds an all-reduce of [T, hidden] in
 * forward; the LM head's cross-entropy its three [T] fp32 all-reduces in forward and an
 * all-reduce of its input gradient in backward. BW nodes (weight gradients) need none.
 */
