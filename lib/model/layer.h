/* distlab (private): one transformer layer's tensors by name. The layout's per-layer table in
 * model.c is indexed by these constants (designated initialisers), so a layer's tensor order is
 * this enum's by construction; the forward and backward (gpt_impl.h) reach a layer's tensors
 * through dl_layer_view, never by numeric offsets. tests/unit/model/test_gpt.c (layer_views)
 * checks every view against the tensor of its name. */
#ifndef DISTLAB_MODEL_LAYER_H
#define DISTLAB_MODEL_LAYER_H

/* A layer's tensors in layout order: tensor k + DL_LT_X of a layer whose first tensor is k. */
enum dl_layer_tensor {
    DL_LT_LN1_W,     /* ln_1.weight */
    DL_LT_LN1_B,     /* ln_1.bias */
    DL_LT_QKV_W,     /* attn.c_attn.weight */
    DL_LT_QKV_B,     /* attn.c_attn.bias */
    DL_LT_ATTPROJ_W, /* attn.c_proj.weight */
    DL_LT_ATTPROJ_B, /* attn.c_proj.bias */
    DL_LT_LN2_W,     /* ln_2.weight */
    DL_LT_LN2_B,     /* ln_2.bias */
    DL_LT_FC_W,      /* mlp.c_fc.weight */
    DL_LT_FC_B,      /* mlp.c_fc.bias */
    DL_LT_FCPROJ_W,  /* mlp.c_proj.weight */
    DL_LT_FCPROJ_B,  /* mlp.c_proj.bias */
    DL_LT_COUNT
};

/* One layer's parameters or gradients as named pointers. */
typedef struct dl_layer_view {
    void *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
    void *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} dl_layer_view;

/* The view of the layer whose first tensor is k in a table of tensor pointers (tab[k]: where
 * tensor k's data is now; gpt.c's pw / gw). */
static inline dl_layer_view dl_layer_view_at(void *const *tab, int k)
{
    void *const *t = tab + k;
    dl_layer_view v = {
        .ln1_w = t[DL_LT_LN1_W],
        .ln1_b = t[DL_LT_LN1_B],
        .qkv_w = t[DL_LT_QKV_W],
        .qkv_b = t[DL_LT_QKV_B],
        .attproj_w = t[DL_LT_ATTPROJ_W],
        .attproj_b = t[DL_LT_ATTPROJ_B],
        .ln2_w = t[DL_LT_LN2_W],
        .ln2_b = t[DL_LT_LN2_B],
        .fc_w = t[DL_LT_FC_W],
        .fc_b = t[DL_LT_FC_B],
        .fcproj_w = t[DL_LT_FCPROJ_W],
        .fcproj_b = t[DL_LT_FCPROJ_B],
    };
    return v;
}

#endif
