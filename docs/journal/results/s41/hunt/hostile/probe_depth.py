import sys; sys.path.insert(0,'/work/main/src'); import ckptzip, collections, traceback
c = collections.Counter()
def deep(k, f):
    if k == 0: return f()
    return deep(k-1, f)
for k in range(0, 120, 1):
    try:
        deep(k, lambda: ckptzip.load('tmpxginq1s3//x.ckz', threads=1))
        c['loaded'] += 1
    except ckptzip.Error as e:
        c['ckptzip:' + str(e)[-60:]] += 1
    except BaseException as e:
        c['OTHER:' + type(e).__name__ + ':' + traceback.format_exc().splitlines()[-3][:120]] += 1
for k, v in c.items(): print(v, k)
